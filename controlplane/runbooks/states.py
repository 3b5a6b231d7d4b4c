"""Runbook run states and the transitions between them: a pure state machine, no I/O."""

from __future__ import annotations

import enum


class RunState(enum.StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"  # dangerous, asked for by a person: a second operator must approve
    QUEUED = "queued"  # holds its target; the process starts it right after the request commits
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # exited non-zero (a 'stop' step failed), or could not start, or was lost
    TIMED_OUT = "timed_out"  # killed at the runbook's declared timeout
    REJECTED = "rejected"  # an operator (or the requester) said no before it started
    EXPIRED = "expired"  # nobody approved it in time, or it was never started


class Trigger(enum.StrEnum):
    PERSON = "person"  # the API with a bearer token (a shell, a script)
    CONSOLE = "console"  # the API with the console's session cookie
    ALERT = "alert"  # the alert evaluator, within its automatic allowance


ACTIVE = frozenset({RunState.QUEUED, RunState.RUNNING})  # these hold their target
OPEN = frozenset({RunState.AWAITING_APPROVAL, *ACTIVE})
RESUMABLE = frozenset({RunState.FAILED, RunState.TIMED_OUT})


class IllegalTransition(ValueError):
    """The run cannot go from its current state to the one asked for."""


# (from, event) -> to
_TRANSITIONS: dict[tuple[RunState, str], RunState] = {
    (RunState.AWAITING_APPROVAL, "approve"): RunState.QUEUED,
    (RunState.AWAITING_APPROVAL, "reject"): RunState.REJECTED,
    (RunState.AWAITING_APPROVAL, "expire"): RunState.EXPIRED,
    (RunState.QUEUED, "start"): RunState.RUNNING,
    (RunState.QUEUED, "reject"): RunState.REJECTED,
    (RunState.QUEUED, "expire"): RunState.EXPIRED,
    (RunState.QUEUED, "fail"): RunState.FAILED,
    (RunState.RUNNING, "succeed"): RunState.SUCCEEDED,
    (RunState.RUNNING, "fail"): RunState.FAILED,
    (RunState.RUNNING, "time_out"): RunState.TIMED_OUT,
}


def transition(state: RunState, event: str) -> RunState:
    """Return the state after `event`, or raise IllegalTransition naming both."""
    try:
        return _TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(
            f"cannot {event.replace('_', ' ')} a run that is {state.value.replace('_', ' ')}"
        ) from None
