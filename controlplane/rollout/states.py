"""Rollout vocabulary and the transitions between states: a pure state machine, no I/O.

`RolloutState`, `Strategy`, `Slot` and `Verdict` are StrEnums, so the database keeps storing the
same strings. `_TRANSITIONS` is exactly what the code does: `controlplane.rollout.lifecycle` is the
one writer of a rollout's state and refuses any change the table lacks.
"""

from __future__ import annotations

import enum


class RolloutState(enum.StrEnum):
    LOADING = "loading"  # candidate being loaded into the idle slot and checked on its golden samples
    PROGRESSING = "progressing"  # taking its step's share of traffic; analysed when the step's pause ends
    PAUSED = "paused"  # held by a person, or by an inconclusive analysis: never promotes by itself
    SUCCEEDED = "succeeded"  # all traffic on the candidate, which is now the stable version
    ROLLED_BACK = "rolled_back"  # traffic back on the stable version (analysis failed, or a person asked)
    ABORTED = "aborted"  # stopped by a person before it finished; traffic back on the stable version


class Strategy(enum.StrEnum):
    CANARY = "canary"  # steps of traffic, each analysed against the stable version
    BLUEGREEN = "bluegreen"  # load and verify, then all traffic at once
    ROLLBACK = "rollback"  # the record of a one-click rollback to the previous stable version


DEPLOY_STRATEGIES = (Strategy.CANARY, Strategy.BLUEGREEN)  # what a person may ask a deploy for


class Slot(enum.StrEnum):
    BLUE = "blue"
    GREEN = "green"

    @property
    def other(self) -> Slot:
        """Return the slot beside this one."""
        return Slot.GREEN if self is Slot.BLUE else Slot.BLUE


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


INITIAL = RolloutState.LOADING  # every rollout, a rollback's record included, starts by loading
ACTIVE = frozenset({RolloutState.LOADING, RolloutState.PROGRESSING, RolloutState.PAUSED})
FINISHED = frozenset({RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.ABORTED})


class IllegalTransition(ValueError):
    """The rollout cannot go from its current state to the one asked for."""


# (from, event) -> to. Person's actions: promote, promote_all, pause, resume, abort, rollback; the
# controller's: loaded, switched, load_failed, step_passed, completed, inconclusive, failed.
_TRANSITIONS: dict[tuple[RolloutState, str], RolloutState] = {
    # every process loaded and verified the candidate: it takes its first step (a canary's share)
    (RolloutState.LOADING, "loaded"): RolloutState.PROGRESSING,
    # ... or its first step is all traffic (blue-green, a rollback's reload, a rollback to a loaded version)
    (RolloutState.LOADING, "switched"): RolloutState.SUCCEEDED,
    (RolloutState.LOADING, "load_failed"): RolloutState.ROLLED_BACK,
    (RolloutState.LOADING, "abort"): RolloutState.ABORTED,
    (RolloutState.LOADING, "rollback"): RolloutState.ROLLED_BACK,
    (RolloutState.PROGRESSING, "step_passed"): RolloutState.PROGRESSING,
    (RolloutState.PROGRESSING, "completed"): RolloutState.SUCCEEDED,
    (RolloutState.PROGRESSING, "inconclusive"): RolloutState.PAUSED,
    (RolloutState.PROGRESSING, "failed"): RolloutState.ROLLED_BACK,
    (RolloutState.PROGRESSING, "pause"): RolloutState.PAUSED,
    # a promote onto the last step is a promote_all: it ends the rollout
    (RolloutState.PROGRESSING, "promote"): RolloutState.PROGRESSING,
    (RolloutState.PROGRESSING, "promote_all"): RolloutState.SUCCEEDED,
    (RolloutState.PROGRESSING, "abort"): RolloutState.ABORTED,
    (RolloutState.PROGRESSING, "rollback"): RolloutState.ROLLED_BACK,
    (RolloutState.PAUSED, "resume"): RolloutState.PROGRESSING,
    (RolloutState.PAUSED, "promote"): RolloutState.PROGRESSING,
    (RolloutState.PAUSED, "promote_all"): RolloutState.SUCCEEDED,
    (RolloutState.PAUSED, "abort"): RolloutState.ABORTED,
    (RolloutState.PAUSED, "rollback"): RolloutState.ROLLED_BACK,
}


def transitions() -> dict[tuple[RolloutState, str], RolloutState]:
    """Return a copy of the whole table: (state, event) -> state."""
    return dict(_TRANSITIONS)


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
