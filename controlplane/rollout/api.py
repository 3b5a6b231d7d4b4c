"""The rollout API: deploy, act on a rollout, one-click rollback, and the state behind it all.

Bodies and answers are typed in `rollout.schemas`; the contract (`controlplane.contract`) parses
each body before the view runs and validates what the view answers.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from flask import Blueprint
from sqlalchemy.orm import Session

from controlplane.auth import Role
from controlplane.auth.audit import refusals_recorded
from controlplane.auth.guard import current_actor, refusals_audited, request_audit, require_role
from controlplane.context import current_services, get_db
from controlplane.contract import operation
from controlplane.errors import NotFound
from controlplane.models import Deployment, EngineDesired, EngineStatus
from controlplane.rollout import deployments, enginewide, service
from controlplane.rollout.readmodel import ACTIONS, describe_deployment, describe_rollout, node_of, rollout_json
from controlplane.rollout.schemas import (
    BatchingChange,
    BatchingView,
    CompactView,
    DeploymentView,
    DeployRequest,
    EngineDesiredView,
    FirstDeployView,
    RollbackView,
    RolloutDetail,
    RolloutView,
    SlotReloadView,
    UndeployView,
)
from controlplane.rollout.states import Slot

bp = Blueprint("rollouts", __name__, url_prefix="/api")

MODEL = {"name": "a model in the registry"}


def _refusals_recorded(session: Session, action: str, target: str) -> AbstractContextManager[None]:
    return refusals_recorded(session, current_actor(), action, target)


def _committed(session: Session) -> None:
    session.commit()
    current_services().reconciler.wake()  # this process converges at once; others poll


@bp.post("/models/<name>/deploy")
@require_role(Role.OPERATOR, action="rollout.start")
@operation(
    body=DeployRequest, response=RolloutView | FirstDeployView, status=202, path=MODEL,
    errors={404: "The registry has no such version", 409: "A rollout is in progress, or it is the stable version"},
)  # fmt: skip
def deploy(name: str, body: DeployRequest) -> tuple[dict[str, Any], int]:
    """Start a rollout of a version (canary or bluegreen), or serve a model that is not deployed yet (first deploy)."""
    version = body.version
    if not (current_services().locate(name, version) / "model.onnx").is_file():
        raise NotFound(f"model '{name}' has no version {version}; push it to the registry first")
    session = get_db()
    if session.get(Deployment, name) is None:
        with _refusals_recorded(session, "model.deploy", f"{name}:{version}"):
            created = deployments.first_deploy(session, name, version, request_audit)
        _committed(session)
        return deployments.deployment_json(created, "loading"), 202
    with _refusals_recorded(session, "rollout.start", f"{name}:{version}"):
        rollout = service.deploy(
            session, name, version, current_actor().name, request_audit,
            strategy=body.strategy, steps=body.steps, pause_s=body.pause_s, shadow=body.shadow,
            policy=body.policy_dict(), settings=current_services().settings.rollout,
        )  # fmt: skip
    _committed(session)
    return rollout_json(rollout), 202


@bp.post("/models/<name>/undeploy")
@require_role(Role.OPERATOR, action="model.undeploy")
@operation(response=UndeployView, path=MODEL, errors={404: "Not deployed", 409: "A rollout is in progress"})
def undeploy(name: str) -> dict[str, Any]:
    """Stop serving a model: its desired state goes and every process unloads it (its versions stay)."""
    session = get_db()
    with _refusals_recorded(session, "model.undeploy", name):
        result = deployments.undeploy(session, name, request_audit)
    _committed(session)
    return result


@bp.post("/rollouts/<int:rollout_id>/<action>")
@require_role(Role.OPERATOR)
@operation(
    response=RolloutView, path={"action": f"one of {', '.join(ACTIONS)}"},
    errors={404: "No such rollout or action", 409: "The rollout's state does not allow the action"},
)  # fmt: skip
def act(rollout_id: int, action: str) -> dict[str, Any]:
    """Promote (one step or all the way), pause, resume or abort a rollout."""
    if action not in ACTIONS:
        raise NotFound(f"no rollout action {action!r}; use one of {list(ACTIONS)}")
    session = get_db()
    with _refusals_recorded(session, f"rollout.{action}", str(rollout_id)):
        rollout = service.act(session, rollout_id, action, current_actor().name, request_audit)
    _committed(session)
    return rollout_json(rollout)


@bp.post("/models/<name>/rollback")
@require_role(Role.OPERATOR, action="rollout.rollback")
@operation(
    response=RollbackView, path=MODEL,
    errors={404: "Not deployed", 409: "Nothing to roll back to, or its last stable time is too long ago"},
)  # fmt: skip
def rollback(name: str) -> dict[str, Any]:
    """One-click rollback: traffic returns to the last stable version at once."""
    session = get_db()
    with _refusals_recorded(session, "rollout.rollback", name):
        result = service.rollback(
            session, name, current_actor().name, request_audit, current_services().settings.rollout
        )
    _committed(session)
    return result


@bp.get("/models/<name>/deployment")
@operation(response=DeploymentView, path=MODEL, errors={404: "Not deployed"})
def deployment(name: str) -> dict[str, Any]:
    """Desired state of a model's slots, what each process reports, and its latest rollouts."""
    found = describe_deployment(get_db(), name, current_services().settings.liveness)
    if found is None:
        raise NotFound(f"model '{name}' has no deployment")
    return found


@bp.get("/rollouts/<int:rollout_id>")
@operation(response=RolloutDetail, errors={404: "No such rollout"})
def show(rollout_id: int) -> dict[str, Any]:
    """A rollout with every step's analysis: why it moved or stopped."""
    found = describe_rollout(get_db(), rollout_id)
    if found is None:
        raise NotFound(f"no rollout {rollout_id}")
    return found


# -- engine-wide desired state and slot reloads --------------------------------------------------


def _own_batching() -> dict[str, Any]:
    """This process's own batching settings: what a null desired limit means."""
    settings = current_services().settings
    return {key: getattr(settings, key) for key in enginewide.BATCHING_LIMITS}


def _engine_status_json(row: EngineStatus) -> dict[str, Any]:
    return {
        "process": row.process,
        "node": node_of(row.process),
        "generation": row.generation,
        "compact_generation": row.compact_generation,
        "error": row.error,
        "report": row.report,
        "updated_at": row.updated_at.isoformat(),
    }


@bp.put("/engine/batching")
@require_role(Role.OPERATOR, action="engine.batching")
@refusals_audited("engine.batching", lambda: "engine")
@operation(body=BatchingChange, response=BatchingView)
def set_batching(body: BatchingChange) -> dict[str, Any]:
    """Set batching limits for every serving process; each process's reconciler applies them to its batchers."""
    session = get_db()
    result = enginewide.set_engine_batching(
        session, body.changes(), current_actor().name, request_audit, _own_batching()
    )
    _committed(session)
    return result


@bp.post("/engine/compact")
@require_role(Role.OPERATOR, action="engine.compact")
@operation(response=CompactView, status=202)
def compact() -> tuple[dict[str, int], int]:
    """Ask every serving process to compact its memory once (ONNX Runtime arenas, free heap)."""
    session = get_db()
    result = enginewide.request_compaction(session, current_actor().name, request_audit)
    _committed(session)
    return result, 202


@bp.get("/engine/desired")
@operation(response=EngineDesiredView)
def engine_desired() -> dict[str, Any]:
    """Engine-wide desired state and what every live process (a heartbeat in the last three) has applied."""
    session = get_db()
    desired = session.get(EngineDesired, 1)
    if desired is None:  # a database without the row: nothing was ever asked for
        desired = EngineDesired(generation=1, compact_generation=0)
    return {
        "generation": desired.generation,
        "compact_generation": desired.compact_generation,
        "batching": enginewide.effective_batching(desired, _own_batching()),
        "processes": [
            _engine_status_json(row)
            for row in enginewide.engine_processes(
                session, heard_from_s=current_services().settings.liveness.gone_after_s
            )
        ],
    }


@bp.post("/models/<name>/slots/<slot>/reload")
@require_role(Role.OPERATOR, action="slot.reload")
@operation(
    response=SlotReloadView, status=202, path={**MODEL, "slot": " or ".join(Slot)},
    errors={404: "Not deployed, or no such slot", 409: "The slot is empty, or nothing else would serve"},
)  # fmt: skip
def reload_slot(name: str, slot: str) -> tuple[dict[str, Any], int]:
    """Drain one slot and load and verify its version again in every process; its traffic returns after."""
    session = get_db()
    with _refusals_recorded(session, "slot.reload", f"{name}:{slot}"):
        result = service.reload_slot(session, name, slot, current_actor().name, request_audit)
    _committed(session)
    return result, 202
