"""Runbook runs: who asked for which registered script with which arguments, who approved it, what it printed."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models import Base


class RunbookRun(Base):
    """One run of a runbook script, from its request to its end (states in controlplane.runbooks.states)."""

    __tablename__ = "runbook_runs"
    __table_args__ = (Index("ix_runbook_runs_runbook_id", "runbook", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    runbook: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict] = mapped_column(JSON)  # validated, with defaults filled in
    target: Mapped[str] = mapped_column(String(160))  # what it acts on: "model:<name>" or "engine"
    # Set only while the run is queued or running, so the unique constraint allows one run per target.
    active_target: Mapped[str | None] = mapped_column(String(160), unique=True)
    trigger: Mapped[str] = mapped_column(String(16))  # person | console | alert
    reason: Mapped[str] = mapped_column(Text, default="")  # why it was asked for (the alert, a note)
    state: Mapped[str] = mapped_column(String(24), index=True)
    dry_run: Mapped[bool] = mapped_column(default=False)
    from_step: Mapped[str | None] = mapped_column(String(64))
    resumed_from: Mapped[int | None]
    requested_by: Mapped[str] = mapped_column(String(128))
    requested_by_id: Mapped[int | None]  # users.id; None for the system (alerts)
    requested_at: Mapped[datetime]
    approval_deadline: Mapped[datetime | None]
    approved_by: Mapped[str | None] = mapped_column(String(128))
    approved_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    deadline: Mapped[datetime | None]  # after this a 'running' row whose process vanished counts as lost
    finished_at: Mapped[datetime | None]
    token_id: Mapped[int | None]  # the run's short-lived API token, revoked when it ends
    exit_code: Mapped[int | None]
    steps: Mapped[list] = mapped_column(JSON, default=list)
    output: Mapped[str] = mapped_column(Text, default="")  # stdout and stderr, capped
    error: Mapped[str] = mapped_column(Text, default="")  # why it failed, was refused or expired
