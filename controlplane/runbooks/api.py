"""The runbook API: the registered runbooks, their runs, approvals (two-person rule) and resumption.

The runner is the composition root's (`current_services().runbooks`), the one the alert evaluator
starts automatic runs with. A run is recorded and committed with its audit event, then started in
this process; GET /api/runbooks/runs/<id> follows it. A refused request, a body that does not fit
`runbooks.schemas` included, leaves a 'denied' (access) or 'error' audit event.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from sqlalchemy.orm import Session

from controlplane.auth import Actor, Role
from controlplane.auth.guard import current_actor, refusals_audited, require_role
from controlplane.context import current_services, get_db
from controlplane.contract import operation
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.readmodel import expire_due, run_json
from controlplane.runbooks.runner import RunbookRunner
from controlplane.runbooks.schemas import (
    RejectRequest,
    RunbookList,
    RunbookView,
    RunDetail,
    RunList,
    RunRequest,
    RunsQuery,
    RunView,
)
from controlplane.runbooks.states import RunState, Trigger

bp = Blueprint("runbooks", __name__, url_prefix="/api/runbooks")

RUNBOOK = {"name": "the runbook's name (its script's file name)"}
RUN = {"run_id": "the run's id"}


def _runner() -> RunbookRunner:
    return current_services().runbooks


def _actor() -> Actor:
    actor = current_actor()
    assert actor is not None  # require_role let the request through
    return actor


def _trigger(actor: Actor) -> Trigger:
    return Trigger.CONSOLE if actor.kind == "user" else Trigger.PERSON


def _run_target(name: str | None = None, run_id: int | None = None, **_: Any) -> str:
    return str(name if name is not None else run_id)


def _launched(session: Session, runner: RunbookRunner, run: RunbookRun) -> RunbookRun:
    """Start a committed, queued run in this process; return it as it stands after the start."""
    if run.state == RunState.QUEUED.value and runner.launch(run.id):
        session.refresh(run)
    return run


@bp.get("")
@operation(response=RunbookList)
def list_runbooks() -> dict[str, Any]:
    """List the registered runbooks' declarations, and the scripts whose declarations are unusable."""
    usable, broken = _runner().catalog.all()
    return {
        "runbooks": [r.to_dict() for r in usable],
        "invalid": [{"name": name, "error": why} for name, why in broken.items()],
    }


@bp.get("/<name>")
@operation(response=RunbookView, errors={404: "No such runbook"}, path=RUNBOOK)
def show_runbook(name: str) -> dict[str, Any]:
    """Show one runbook's declaration: parameters, role, timeout, steps."""
    return _runner().catalog.get(name).to_dict()


@bp.post("/<name>/runs")
@require_role(Role.OPERATOR, action="runbook.request")
@refusals_audited("runbook.request", _run_target)
@operation(
    body=RunRequest, body_required=False, response=RunView, status=202, path=RUNBOOK,
    errors={404: "No such runbook", 409: "Another run is acting on the same target"},
)  # fmt: skip
def start_run(name: str, body: RunRequest) -> tuple[dict[str, Any], int]:
    """Run a runbook; a dangerous one waits for a second operator's approval."""
    session, actor, runner = get_db(), _actor(), _runner()
    run = runner.request(
        session, name, body.params, actor, _trigger(actor), dry_run=body.dry_run, from_step=body.from_step,
        reason=body.reason,
    )  # fmt: skip
    session.commit()
    return run_json(_launched(session, runner, run)), 202


@bp.get("/runs")
@operation(query=RunsQuery, response=RunList)
def list_runs(query: RunsQuery) -> dict[str, Any]:
    """List runs, newest first."""
    session, runner = get_db(), _runner()
    expire_due(session, runner)
    state = query.state.value if query.state is not None else None
    return {"runs": [run_json(r) for r in runner.list_runs(session, query.runbook, state, query.limit)]}


@bp.get("/runs/<int:run_id>")
@operation(response=RunDetail, errors={404: "No such run"}, path=RUN)
def show_run(run_id: int) -> dict[str, Any]:
    """Show one run with its recorded steps and captured output."""
    session, runner = get_db(), _runner()
    expire_due(session, runner)
    return run_json(runner.get(session, run_id), detail=True)


@bp.post("/runs/<int:run_id>/approve")
@require_role(Role.OPERATOR, action="runbook.approve")
@refusals_audited("runbook.approve", _run_target)
@operation(response=RunView, path=RUN, errors={404: "No such run", 409: "The run is not awaiting approval"})
def approve_run(run_id: int) -> dict[str, Any]:
    """Approve a dangerous run as the second operator (never its requester); it starts at once."""
    session, runner = get_db(), _runner()
    run = runner.approve(session, run_id, _actor())
    session.commit()
    return run_json(_launched(session, runner, run))


@bp.post("/runs/<int:run_id>/reject")
@require_role(Role.OPERATOR, action="runbook.reject")
@refusals_audited("runbook.reject", _run_target)
@operation(
    body=RejectRequest, body_required=False, response=RunView, path=RUN,
    errors={404: "No such run", 409: "The run has started"},
)  # fmt: skip
def reject_run(run_id: int, body: RejectRequest) -> dict[str, Any]:
    """Refuse a run that has not started (its requester may withdraw it)."""
    session = get_db()
    run = _runner().reject(session, run_id, _actor(), body.reason)
    session.commit()
    return run_json(run)


@bp.post("/runs/<int:run_id>/resume")
@require_role(Role.OPERATOR, action="runbook.resume")
@refusals_audited("runbook.resume", _run_target)
@operation(response=RunView, status=202, path=RUN, errors={404: "No such run", 409: "The run did not fail"})
def resume_run(run_id: int) -> tuple[dict[str, Any], int]:
    """Run a failed run's runbook again from the step it failed at (same arguments, same rules)."""
    session, actor, runner = get_db(), _actor(), _runner()
    run = runner.resume(session, run_id, actor, _trigger(actor))
    session.commit()
    return run_json(_launched(session, runner, run)), 202
