"""How runbook runs are shown: the runbook API and the console read these.

Reads first expire approvals past their deadline (`expire_due`), so a run is shown as it stands
now, not as the last write left it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.runner import RunbookRunner


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def run_json(run: RunbookRun, detail: bool = False) -> dict[str, Any]:
    """Describe a run; with `detail`, its steps and captured output too."""
    data = {
        "id": run.id, "runbook": run.runbook, "params": run.params, "target": run.target, "trigger": run.trigger,
        "reason": run.reason, "state": run.state, "dry_run": run.dry_run, "from_step": run.from_step,
        "resumed_from": run.resumed_from, "requested_by": run.requested_by, "requested_at": _iso(run.requested_at),
        "approval_deadline": _iso(run.approval_deadline), "approved_by": run.approved_by,
        "approved_at": _iso(run.approved_at), "started_at": _iso(run.started_at), "finished_at": _iso(run.finished_at),
        "exit_code": run.exit_code, "error": run.error,
    }  # fmt: skip
    if detail:
        data["steps"] = run.steps
        data["output"] = run.output
    return data


def expire_due(session: Session, runner: RunbookRunner) -> None:
    """Expire approvals past their deadline (committing only when something changed), so reads show runs as they stand."""
    if runner.expire(session):
        session.commit()
