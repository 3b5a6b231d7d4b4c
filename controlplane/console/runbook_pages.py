"""The runbooks pages: the catalogue, one runbook with a form built from its declaration, one run live."""

from __future__ import annotations

from typing import Any

from flask import Response, request
from sqlalchemy.orm import Session

from controlplane.console.base import bp, login_required, page
from controlplane.context import current_services, get_db
from controlplane.runbooks.readmodel import expire_due, run_json
from controlplane.runbooks.runner import RunbookRunner
from controlplane.runbooks.states import OPEN, RESUMABLE, RunState

RUNS_SHOWN = 30
RUN_REFRESH_S = 1


def _runner() -> RunbookRunner:
    return current_services().runbooks


def _runs(db: Session, runbook: str | None = None) -> list[dict[str, Any]]:
    runner = _runner()
    expire_due(db, runner)
    return [run_json(r) for r in runner.list_runs(db, runbook, None, RUNS_SHOWN)]


@bp.get("/runbooks")
@login_required
def runbooks() -> Response:
    """The registered runbooks with their descriptions, the unusable ones with why, and the latest runs."""
    usable, broken = _runner().catalog.all()
    return page(
        "console/runbooks.html",
        runbooks=[r.to_dict() for r in usable],
        broken=broken,
        runs=_runs(get_db()),
    )


def form_fields(params: dict[str, dict[str, Any]], given: dict[str, str]) -> list[dict[str, Any]]:
    """Describe one form field per declared parameter, filled from `given` (a link from an alert) or its default."""
    fields = []
    for name, spec in params.items():
        value = given.get(name, spec.get("default"))
        if spec["type"] == "bool":
            widget = "checkbox"
            value = value in (True, "true", "on", "1")
        elif spec.get("choices") is not None:
            widget = "select"
        elif spec["type"] in ("int", "float"):
            widget = "number"
        else:
            widget = "text"
        fields.append({"name": name, "widget": widget, "value": value, **spec})
    return fields


@bp.get("/runbooks/<name>")
@login_required
def runbook(name: str) -> Response:
    """A runbook: what it does, its steps, the run form (dry run first), and its past runs."""
    declared = _runner().catalog.get(name).to_dict()
    given = {k: v for k, v in request.args.items() if k in declared["params"]}
    return page(
        "console/runbook.html",
        runbook=declared,
        fields=form_fields(declared["params"], given),
        runs=_runs(get_db(), name),
    )


@bp.get("/runbooks/runs/<int:run_id>")
@login_required
def run(run_id: int) -> Response:
    """One run: its arguments, steps and output, refreshed live until it ends; approve, reject or resume it."""
    db, runner = get_db(), _runner()
    expire_due(db, runner)
    found = run_json(runner.get(db, run_id), detail=True)
    state = RunState(found["state"])
    return page(
        "console/run.html",
        run=found,
        live=state in OPEN,
        resumable=state in RESUMABLE,
        awaiting=state is RunState.AWAITING_APPROVAL,
        refresh_s=RUN_REFRESH_S if state in OPEN else 0,
    )
