"""The runbook API: the registered runbooks, their runs, approvals (two-person rule) and resumption.

Registering this blueprint also builds the runner for the app (app.extensions[RUNNER]) unless one
is there already. A run is recorded and committed with its audit event, then started in this
process; GET /api/runbooks/runs/<id> follows it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState
from sqlalchemy.orm import Session

from controlplane.auth import Actor, Role, current_actor, record_event, require_role
from controlplane.auth.errors import AuthError
from controlplane.db import get_db
from controlplane.errors import ApiError
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.runner import MAX_LIST, RunbookRunner, build_runner
from controlplane.runbooks.states import RunState, Trigger

bp = Blueprint("runbooks", __name__, url_prefix="/api/runbooks")
RUNNER = "flightdeck.runbooks"  # app.extensions key; tests put a runner over their own scripts there
RUN_KEYS = frozenset({"params", "dry_run", "from_step", "reason"})


@bp.record_once
def _setup(state: BlueprintSetupState) -> None:
    services = state.app.extensions["flightdeck"]
    if RUNNER not in state.app.extensions:
        # NOTE: the composition root's runner when it has one (the alert evaluator needs the same one).
        runner = getattr(services, "runbooks", None) or build_runner(services.settings, services.sessions)
        state.app.extensions[RUNNER] = runner


def _runner() -> RunbookRunner:
    return current_app.extensions[RUNNER]


def _actor() -> Actor:
    actor = current_actor()
    assert actor is not None  # require_role let the request through
    return actor


def _trigger(actor: Actor) -> Trigger:
    return Trigger.CONSOLE if actor.kind == "user" else Trigger.PERSON


def _body() -> dict[str, Any]:
    data = request.get_json(silent=True)
    if data is None and not request.data:
        return {}
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    return data


@contextmanager
def _refusals_recorded(session: Session, action: str, target: str) -> Iterator[None]:
    """Let a refused request leave a 'denied' (access) or 'error' (anything else) audit event."""
    try:
        yield
    except ApiError as exc:
        session.rollback()
        outcome = "denied" if isinstance(exc, AuthError) else "error"
        record_event(session, current_actor(), action, target, outcome, {"error": exc.message})
        session.commit()
        raise


def run_json(run: RunbookRun, detail: bool = False) -> dict[str, Any]:
    """Describe a run; with `detail`, its steps and captured output too."""

    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    data = {
        "id": run.id, "runbook": run.runbook, "params": run.params, "target": run.target, "trigger": run.trigger,
        "reason": run.reason, "state": run.state, "dry_run": run.dry_run, "from_step": run.from_step,
        "resumed_from": run.resumed_from, "requested_by": run.requested_by, "requested_at": iso(run.requested_at),
        "approval_deadline": iso(run.approval_deadline), "approved_by": run.approved_by,
        "approved_at": iso(run.approved_at), "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
        "exit_code": run.exit_code, "error": run.error,
    }  # fmt: skip
    if detail:
        data["steps"] = run.steps
        data["output"] = run.output
    return data


def expire_due(session: Session) -> None:
    """Expire approvals past their deadline, so that reads show runs as they stand now."""
    if _runner().expire(session):
        session.commit()


@bp.get("")
def list_runbooks() -> Response:
    """The registered runbooks' declarations, and the scripts whose declarations are unusable."""
    usable, broken = _runner().catalog.all()
    return jsonify(
        {
            "runbooks": [r.to_dict() for r in usable],
            "invalid": [{"name": name, "error": why} for name, why in broken.items()],
        }
    )


@bp.get("/<name>")
def show_runbook(name: str) -> Response:
    """One runbook's declaration."""
    return jsonify(_runner().catalog.get(name).to_dict())


@bp.post("/<name>/runs")
@require_role(Role.OPERATOR, action="runbook.request")
def start_run(name: str) -> tuple[Response, int]:
    """Run a runbook: {params, dry_run, from_step, reason}; a dangerous one waits for a second operator."""
    session, actor, runner = get_db(), _actor(), _runner()
    with _refusals_recorded(session, "runbook.request", name):
        body = _body()
        unknown = sorted(set(body) - RUN_KEYS)
        if unknown:
            raise ApiError(f"unknown field(s) {unknown}; send {sorted(RUN_KEYS)}")
        dry_run, reason = body.get("dry_run", False), body.get("reason", "")
        if not isinstance(dry_run, bool) or not isinstance(reason, str):
            raise ApiError("'dry_run' must be true or false and 'reason' a string")
        run = runner.request(
            session, name, body.get("params"), actor, _trigger(actor), dry_run=dry_run,
            from_step=body.get("from_step"), reason=reason,
        )  # fmt: skip
        session.commit()
    if run.state == RunState.QUEUED.value and runner.launch(run.id):
        session.refresh(run)
    return jsonify(run_json(run)), 202


@bp.get("/runs")
def list_runs() -> Response:
    """Runs, newest first: ?runbook= &state= &limit= (1-500, default 50)."""
    raw_limit = request.args.get("limit", "50")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIST:
        raise ApiError(f"'limit' must be a whole number from 1 to {MAX_LIST}; got {raw_limit!r}")
    state = request.args.get("state") or None
    if state is not None and state not in {s.value for s in RunState}:
        raise ApiError(f"'state' must be one of {[s.value for s in RunState]}; got {state!r}")
    session = get_db()
    expire_due(session)
    runs = _runner().list_runs(session, request.args.get("runbook") or None, state, int(raw_limit))
    return jsonify({"runs": [run_json(r) for r in runs]})


@bp.get("/runs/<int:run_id>")
def show_run(run_id: int) -> Response:
    """One run with its recorded steps and captured output."""
    session = get_db()
    expire_due(session)
    return jsonify(run_json(_runner().get(session, run_id), detail=True))


@bp.post("/runs/<int:run_id>/approve")
@require_role(Role.OPERATOR, action="runbook.approve")
def approve_run(run_id: int) -> Response:
    """Approve a dangerous run as the second operator (never its requester); it starts at once."""
    session, runner = get_db(), _runner()
    with _refusals_recorded(session, "runbook.approve", str(run_id)):
        run = runner.approve(session, run_id, _actor())
        session.commit()
    if runner.launch(run.id):
        session.refresh(run)
    return jsonify(run_json(run))


@bp.post("/runs/<int:run_id>/reject")
@require_role(Role.OPERATOR, action="runbook.reject")
def reject_run(run_id: int) -> Response:
    """Refuse a run that has not started (its requester may withdraw it): {reason}."""
    session = get_db()
    with _refusals_recorded(session, "runbook.reject", str(run_id)):
        reason = _body().get("reason", "")
        if not isinstance(reason, str):
            raise ApiError("'reason' must be a string")
        run = _runner().reject(session, run_id, _actor(), reason)
        session.commit()
    return jsonify(run_json(run))


@bp.post("/runs/<int:run_id>/resume")
@require_role(Role.OPERATOR, action="runbook.resume")
def resume_run(run_id: int) -> tuple[Response, int]:
    """Run a failed run's runbook again from the step it failed at (same arguments, same rules)."""
    session, actor, runner = get_db(), _actor(), _runner()
    with _refusals_recorded(session, "runbook.resume", str(run_id)):
        run = runner.resume(session, run_id, actor, _trigger(actor))
        session.commit()
    if run.state == RunState.QUEUED.value and runner.launch(run.id):
        session.refresh(run)
    return jsonify(run_json(run)), 202
