"""The rollout API: deploy, act on a rollout, one-click rollback, and the state behind it all."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.auth import Role, current_actor, record_event, require_role
from controlplane.auth.audit import refusals_recorded
from controlplane.db import get_db
from controlplane.errors import ApiError, NotFound
from controlplane.models import Deployment, EngineDesired, EngineStatus, Rollout, RolloutMeasurement, SlotStatus
from controlplane.rollout import deployments, service

bp = Blueprint("rollouts", __name__, url_prefix="/api")

ACTIONS = ("promote", "promote_all", "pause", "resume", "abort")


def _services():
    return current_app.extensions["flightdeck"]


def _audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
    record_event(session, current_actor(), action, target, outcome, detail)


def _body() -> dict[str, Any]:
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    return data


def rollout_json(rollout: Rollout, measurements: list[RolloutMeasurement] | None = None) -> dict[str, Any]:
    """Describe a rollout, with its step analyses when given."""
    data = {
        "id": rollout.id,
        "model": rollout.model,
        "from_version": rollout.from_version,
        "to_version": rollout.to_version,
        "candidate_slot": rollout.candidate_slot,
        "strategy": rollout.strategy,
        "steps": rollout.steps,
        "step_index": rollout.step_index,
        "traffic_percent": rollout.steps[rollout.step_index] if rollout.state != "loading" else 0,
        "pause_s": rollout.pause_s,
        "shadow": rollout.shadow,
        "policy": rollout.policy,
        "state": rollout.state,
        "reason": rollout.reason,
        "created_by": rollout.created_by,
        "created_at": rollout.created_at.isoformat(),
        "updated_at": rollout.updated_at.isoformat(),
        "finished_at": rollout.finished_at.isoformat() if rollout.finished_at else None,
    }
    if measurements is not None:
        data["measurements"] = [
            {
                "step_index": m.step_index,
                "ts": m.ts.isoformat(),
                "verdict": m.verdict,
                "reasons": m.reasons,
                "figures": m.figures,
            }
            for m in measurements
        ]
    return data


def _refusals_recorded(session: Session, action: str, target: str):
    return refusals_recorded(session, current_actor(), action, target)


def _committed(session: Session) -> None:
    session.commit()
    _services().reconciler.wake()  # this process converges at once; others poll


@bp.post("/models/<name>/deploy")
@require_role(Role.OPERATOR, action="rollout.start")
def deploy(name: str) -> tuple[Response, int]:
    """Start a rollout of a version (canary or bluegreen), or serve a model that is not deployed yet (first deploy)."""
    body = _body()
    version = body.get("version")
    if not isinstance(version, str) or not version:
        raise ApiError("'version' must be a non-empty string")
    if not (_services().locate(name, version) / "model.onnx").is_file():
        raise NotFound(f"model '{name}' has no version {version}; push it to the registry first")
    session = get_db()
    _services().reconciler.forget_failures(name)  # a person asked again: a failed version may retry
    if session.get(Deployment, name) is None:
        with _refusals_recorded(session, "model.deploy", f"{name}:{version}"):
            created = deployments.first_deploy(session, name, version, _audit)
        _committed(session)
        return jsonify(deployments.deployment_json(created, "loading")), 202
    with _refusals_recorded(session, "rollout.start", f"{name}:{version}"):
        rollout = service.deploy(
            session, name, version, current_actor().name, _audit,
            strategy=body.get("strategy", "canary"), steps=body.get("steps"), pause_s=body.get("pause_s"),
            shadow=bool(body.get("shadow", False)), policy=body.get("policy"), settings=_services().settings.rollout,
        )  # fmt: skip
    _committed(session)
    return jsonify(rollout_json(rollout)), 202


@bp.post("/models/<name>/undeploy")
@require_role(Role.OPERATOR, action="model.undeploy")
def undeploy(name: str) -> Response:
    """Stop serving a model: its desired state goes and every process unloads it (its versions stay)."""
    session = get_db()
    with _refusals_recorded(session, "model.undeploy", name):
        result = deployments.undeploy(session, name, _audit)
    _committed(session)
    return jsonify(result)


@bp.post("/rollouts/<int:rollout_id>/<action>")
@require_role(Role.OPERATOR)
def act(rollout_id: int, action: str) -> Response:
    """Promote (one step or all the way), pause, resume or abort a rollout."""
    if action not in ACTIONS:
        raise NotFound(f"no rollout action {action!r}; use one of {list(ACTIONS)}")
    session = get_db()
    with _refusals_recorded(session, f"rollout.{action}", str(rollout_id)):
        rollout = service.act(session, rollout_id, action, current_actor().name, _audit)
    _committed(session)
    return jsonify(rollout_json(rollout))


@bp.post("/models/<name>/rollback")
@require_role(Role.OPERATOR, action="rollout.rollback")
def rollback(name: str) -> Response:
    """One-click rollback: traffic returns to the last stable version at once."""
    session = get_db()
    with _refusals_recorded(session, "rollout.rollback", name):
        result = service.rollback(session, name, current_actor().name, _audit, _services().settings.rollout)
    _committed(session)
    return jsonify(result)


def describe_deployment(session: Session, name: str) -> dict[str, Any] | None:
    """Return a model's desired slots, what each process reports and its latest rollouts; None if undeployed."""
    desired = session.get(Deployment, name)
    if desired is None:
        return None
    statuses = session.scalars(select(SlotStatus).where(SlotStatus.model == name).order_by(SlotStatus.process))
    rollouts = session.scalars(select(Rollout).where(Rollout.model == name).order_by(Rollout.id.desc()).limit(10))
    return {
        "model": name,
        "slots": {slot: {"version": desired.version_in(slot), "weight": desired.weights()[slot]} for slot in ("blue", "green")},
        "stable_slot": desired.stable_slot,
        "generation": desired.generation,
        "processes": [
            {"process": s.process, "slot": s.slot, "version": s.version, "state": s.state, "error": s.error,
             "generation": s.generation, "updated_at": s.updated_at.isoformat()}
            for s in statuses
        ],
        "rollouts": [rollout_json(r) for r in rollouts],
    }  # fmt: skip


def describe_rollout(session: Session, rollout_id: int) -> dict[str, Any] | None:
    """Return a rollout with every step's analysis, or None if there is no such rollout."""
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        return None
    measurements = session.scalars(
        select(RolloutMeasurement).where(RolloutMeasurement.rollout_id == rollout_id).order_by(RolloutMeasurement.id)
    )
    return rollout_json(rollout, list(measurements))


@bp.get("/models/<name>/deployment")
def deployment(name: str) -> Response:
    """Desired state of a model's slots, what each process reports, and its latest rollouts."""
    found = describe_deployment(get_db(), name)
    if found is None:
        raise NotFound(f"model '{name}' has no deployment")
    return jsonify(found)


@bp.get("/rollouts/<int:rollout_id>")
def show(rollout_id: int) -> Response:
    """A rollout with every step's analysis: why it moved or stopped."""
    found = describe_rollout(get_db(), rollout_id)
    if found is None:
        raise NotFound(f"no rollout {rollout_id}")
    return jsonify(found)


# -- engine-wide desired state and slot reloads --------------------------------------------------


def _own_batching() -> dict[str, Any]:
    """This process's own batching settings: what a null desired limit means."""
    settings = _services().settings
    return {key: getattr(settings, key) for key in service.BATCHING_LIMITS}


def _engine_status_json(row: EngineStatus) -> dict[str, Any]:
    return {
        "process": row.process,
        "generation": row.generation,
        "compact_generation": row.compact_generation,
        "error": row.error,
        "report": row.report,
        "updated_at": row.updated_at.isoformat(),
    }


@bp.put("/engine/batching")
@require_role(Role.OPERATOR, action="engine.batching")
def set_batching() -> Response:
    """Set batching limits for every serving process; each process's reconciler applies them to its batchers."""
    session = get_db()
    with _refusals_recorded(session, "engine.batching", "engine"):
        changes = service.check_batching(_body())
        result = service.set_engine_batching(session, changes, current_actor().name, _audit, _own_batching())
    _committed(session)
    return jsonify(result)


@bp.post("/engine/compact")
@require_role(Role.OPERATOR, action="engine.compact")
def compact() -> tuple[Response, int]:
    """Ask every serving process to compact its memory once (ONNX Runtime arenas, free heap)."""
    session = get_db()
    result = service.request_compaction(session, current_actor().name, _audit)
    _committed(session)
    return jsonify(result), 202


@bp.get("/engine/desired")
def engine_desired() -> Response:
    """Engine-wide desired state and what every process heard from in the last minute has applied."""
    session = get_db()
    desired = session.get(EngineDesired, 1)
    if desired is None:  # a database without the row: nothing was ever asked for
        desired = EngineDesired(generation=1, compact_generation=0)
    return jsonify(
        {
            "generation": desired.generation,
            "compact_generation": desired.compact_generation,
            "batching": service.effective_batching(desired, _own_batching()),
            "processes": [_engine_status_json(row) for row in service.engine_processes(session)],
        }
    )


@bp.post("/models/<name>/slots/<slot>/reload")
@require_role(Role.OPERATOR, action="slot.reload")
def reload_slot(name: str, slot: str) -> tuple[Response, int]:
    """Drain one slot and load and verify its version again in every process; its traffic returns after."""
    session = get_db()
    with _refusals_recorded(session, "slot.reload", f"{name}:{slot}"):
        result = service.reload_slot(session, name, slot, current_actor().name, _audit)
    _committed(session)
    return jsonify(result), 202
