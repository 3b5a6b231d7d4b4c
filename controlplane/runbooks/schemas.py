"""The runbook API's request and response models (`/api/runbooks`).

A run's `params` stay a free-form object here: each runbook declares its own parameters, and
`Runbook.validate` checks them against that declaration (400 `bad_arguments`), as it always has.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from controlplane.auth import Role
from controlplane.contract import Absent, QueryArgs, Reply, RequestBody, Timestamp, absent_key
from controlplane.runbooks.declaration import NAME, ON_FAILURE, TYPES
from controlplane.runbooks.process import STEP_STATUSES
from controlplane.runbooks.runner import MAX_LIST
from controlplane.runbooks.states import RunState, Trigger

# --- requests ---------------------------------------------------------------------------------------


class RunRequest(RequestBody):
    """Ask for a run; a dangerous runbook waits for a second operator unless it is a dry run."""

    params: dict[str, Any] | None = Field(None, description="the runbook's declared parameters, by name")
    dry_run: bool = Field(False, description="check the arguments and show what each step would do")
    from_step: str | None = Field(None, description="start at this step (one of the runbook's steps)")
    reason: str = Field("", description="why: kept with the run and in the audit log")


class RejectRequest(RequestBody):
    reason: str = Field("", description="why: kept with the run")


class RunsQuery(QueryArgs):
    runbook: str | None = Field(None, description="Only runs of this runbook")
    state: RunState | None = Field(None, description="Only runs in this state")
    limit: int = Field(50, ge=1, le=MAX_LIST, description=f"At most this many runs (1 to {MAX_LIST})")

    @field_validator("runbook", "state", mode="before")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None  # ?state= from an empty select means no filter

    @field_validator("limit", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> Any:
        text = str(value)
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIST:
            raise ValueError(f"'limit' must be a whole number from 1 to {MAX_LIST}; got {text!r}")
        return int(text)


# --- declarations -----------------------------------------------------------------------------------


class ParamView(Reply):
    """One declared parameter; the optional keys are absent when the declaration has none."""

    type: Literal[TYPES]  # type: ignore[valid-type]
    required: bool
    help: str
    default: Any = absent_key("used when the run gives none")
    pattern: str | Absent = absent_key("a str must fully match it")
    min: int | float | Absent = absent_key()
    max: int | float | Absent = absent_key()
    choices: list[Any] | Absent = absent_key()


class StepView(Reply):
    name: str
    on_failure: Literal[ON_FAILURE]  # type: ignore[valid-type]


class RunbookView(Reply):
    """A runbook's declaration, as its script describes itself."""

    name: str = Field(pattern=NAME.pattern)
    description: str
    params: dict[str, ParamView]
    role: Role = Field(description="the role a person needs to run it")
    timeout_s: int
    automatic: bool = Field(description="an alert rule may start it")
    dangerous: bool = Field(description="a person's run needs a second operator's approval")
    steps: list[StepView]


class InvalidRunbook(Reply):
    name: str
    error: str = Field(description="why its declaration is unusable")


class RunbookList(Reply):
    runbooks: list[RunbookView]
    invalid: list[InvalidRunbook]


# --- runs -------------------------------------------------------------------------------------------


class RunView(Reply):
    """A run: what was asked, by whom, and how it stands."""

    id: int
    runbook: str
    params: dict[str, Any] = Field(description="checked and typed, defaults filled in")
    target: str = Field(description="what it acts on: model:<name> or engine (one run at a time each)")
    trigger: Trigger
    reason: str
    state: RunState
    dry_run: bool
    from_step: str | None
    resumed_from: int | None = Field(description="the failed run this one resumes")
    requested_by: str
    requested_at: Timestamp
    approval_deadline: Timestamp | None
    approved_by: str | None
    approved_at: Timestamp | None
    started_at: Timestamp | None
    finished_at: Timestamp | None
    exit_code: int | None
    error: str = Field(description="why it failed, was refused or expired")


class RunStep(Reply):
    """One step as the script reported it."""

    step: str
    status: Literal[tuple(sorted(STEP_STATUSES))]  # type: ignore[valid-type]
    detail: Any = Field(description="what the step reports: text, or JSON (long details clipped)")
    at: Timestamp


class RunDetail(RunView):
    """A run with its recorded steps and captured output."""

    steps: list[RunStep]
    output: str = Field(description="stdout and stderr, capped")


class RunList(Reply):
    runs: list[RunView]
