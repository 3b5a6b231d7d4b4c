"""The runbook API: the registered runbooks, their runs, approvals (two-person rule) and resumption.

The runner is the composition root's (`current_services().runbooks`), the one the alert evaluator
starts automatic runs with. A run is recorded and committed with its audit event, then started in
this process; GET /api/runbooks/runs/<id> follows it. A refused request leaves a 'denied' (access)
or 'error' audit event.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy.orm import Session

from controlplane.auth import Actor, Role, current_actor, require_role
from controlplane.auth.audit import refusals_recorded
from controlplane.context import current_services
from controlplane.db import get_db
from controlplane.errors import ApiError
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.readmodel import expire_due, run_json
from controlplane.runbooks.runner import MAX_LIST, RunbookRunner
from controlplane.runbooks.states import RunState, Trigger

bp = Blueprint("runbooks", __name__, url_prefix="/api/runbooks")
RUN_KEYS = frozenset({"params", "dry_run", "from_step", "reason"})


def _runner() -> RunbookRunner:
    return current_services().runbooks


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


def _launched(session: Session, runner: RunbookRunner, run: RunbookRun) -> RunbookRun:
    """Start a committed, queued run in this process; return it as it stands after the start."""
    if run.state == RunState.QUEUED.value and runner.launch(run.id):
        session.refresh(run)
    return run


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
    with refusals_recorded(session, actor, "runbook.request", name):
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
    return jsonify(run_json(_launched(session, runner, run))), 202


@bp.get("/runs")
def list_runs() -> Response:
    """Runs, newest first: ?runbook= &state= &limit= (1-500, default 50)."""
    raw_limit = request.args.get("limit", "50")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIST:
        raise ApiError(f"'limit' must be a whole number from 1 to {MAX_LIST}; got {raw_limit!r}")
    state = request.args.get("state") or None
    if state is not None and state not in {s.value for s in RunState}:
        raise ApiError(f"'state' must be one of {[s.value for s in RunState]}; got {state!r}")
    session, runner = get_db(), _runner()
    expire_due(session, runner)
    runs = runner.list_runs(session, request.args.get("runbook") or None, state, int(raw_limit))
    return jsonify({"runs": [run_json(r) for r in runs]})


@bp.get("/runs/<int:run_id>")
def show_run(run_id: int) -> Response:
    """One run with its recorded steps and captured output."""
    session, runner = get_db(), _runner()
    expire_due(session, runner)
    return jsonify(run_json(runner.get(session, run_id), detail=True))


@bp.post("/runs/<int:run_id>/approve")
@require_role(Role.OPERATOR, action="runbook.approve")
def approve_run(run_id: int) -> Response:
    """Approve a dangerous run as the second operator (never its requester); it starts at once."""
    session, actor, runner = get_db(), _actor(), _runner()
    with refusals_recorded(session, actor, "runbook.approve", str(run_id)):
        run = runner.approve(session, run_id, actor)
        session.commit()
    return jsonify(run_json(_launched(session, runner, run)))


@bp.post("/runs/<int:run_id>/reject")
@require_role(Role.OPERATOR, action="runbook.reject")
def reject_run(run_id: int) -> Response:
    """Refuse a run that has not started (its requester may withdraw it): {reason}."""
    session, actor = get_db(), _actor()
    with refusals_recorded(session, actor, "runbook.reject", str(run_id)):
        reason = _body().get("reason", "")
        if not isinstance(reason, str):
            raise ApiError("'reason' must be a string")
        run = _runner().reject(session, run_id, actor, reason)
        session.commit()
    return jsonify(run_json(run))


@bp.post("/runs/<int:run_id>/resume")
@require_role(Role.OPERATOR, action="runbook.resume")
def resume_run(run_id: int) -> tuple[Response, int]:
    """Run a failed run's runbook again from the step it failed at (same arguments, same rules)."""
    session, actor, runner = get_db(), _actor(), _runner()
    with refusals_recorded(session, actor, "runbook.resume", str(run_id)):
        run = runner.resume(session, run_id, actor, _trigger(actor))
        session.commit()
    return jsonify(run_json(_launched(session, runner, run))), 202
