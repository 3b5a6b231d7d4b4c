"""Rollout states and the transitions between them: a pure state machine, no I/O."""

from __future__ import annotations

import enum


class RolloutState(enum.StrEnum):
    LOADING = "loading"  # candidate being loaded into the idle slot and checked on its golden samples
    PROGRESSING = "progressing"  # taking its step's share of traffic; analysed when the step's pause ends
    PAUSED = "paused"  # held by a person, or by an inconclusive analysis: never promotes by itself
    SUCCEEDED = "succeeded"  # all traffic on the candidate, which is now the stable version
    ROLLED_BACK = "rolled_back"  # traffic back on the stable version (analysis failed, or a person asked)
    ABORTED = "aborted"  # stopped by a person before it finished; traffic back on the stable version


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


ACTIVE = frozenset({RolloutState.LOADING, RolloutState.PROGRESSING, RolloutState.PAUSED})
FINISHED = frozenset({RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.ABORTED})


class IllegalTransition(ValueError):
    """The rollout cannot go from its current state to the one asked for."""


# (from, event) -> to. Events are what people and the controller do.
_TRANSITIONS: dict[tuple[RolloutState, str], RolloutState] = {
    (RolloutState.LOADING, "loaded"): RolloutState.PROGRESSING,
    (RolloutState.LOADING, "load_failed"): RolloutState.ROLLED_BACK,
    (RolloutState.LOADING, "abort"): RolloutState.ABORTED,
    (RolloutState.LOADING, "rollback"): RolloutState.ROLLED_BACK,
    (RolloutState.PROGRESSING, "step_passed"): RolloutState.PROGRESSING,
    (RolloutState.PROGRESSING, "completed"): RolloutState.SUCCEEDED,
    (RolloutState.PROGRESSING, "inconclusive"): RolloutState.PAUSED,
    (RolloutState.PROGRESSING, "failed"): RolloutState.ROLLED_BACK,
    (RolloutState.PROGRESSING, "pause"): RolloutState.PAUSED,
    (RolloutState.PROGRESSING, "promote"): RolloutState.PROGRESSING,
    (RolloutState.PROGRESSING, "promote_all"): RolloutState.SUCCEEDED,
    (RolloutState.PROGRESSING, "abort"): RolloutState.ABORTED,
    (RolloutState.PROGRESSING, "rollback"): RolloutState.ROLLED_BACK,
    (RolloutState.PAUSED, "resume"): RolloutState.PROGRESSING,
    (RolloutState.PAUSED, "promote"): RolloutState.PROGRESSING,
    (RolloutState.PAUSED, "promote_all"): RolloutState.SUCCEEDED,
    (RolloutState.PAUSED, "abort"): RolloutState.ABORTED,
    (RolloutState.PAUSED, "rollback"): RolloutState.ROLLED_BACK,
    (RolloutState.PAUSED, "failed"): RolloutState.ROLLED_BACK,
}


def allowed_events(state: RolloutState) -> frozenset[str]:
    """Return the events that may happen to a rollout in `state`."""
    return frozenset(e for (s, e) in _TRANSITIONS if s == state)


def transition(state: RolloutState, event: str) -> RolloutState:
    """Return the state after `event`, or raise IllegalTransition naming both."""
    try:
        return _TRANSITIONS[(state, event)]
    except KeyError:
        allowed = sorted(e for (s, e) in _TRANSITIONS if s == state)
        raise IllegalTransition(
            f"cannot {event.replace('_', ' ')} a rollout that is {state.value}"
            + (f"; allowed: {', '.join(allowed)}" if allowed else " (it has finished)")
        ) from None
