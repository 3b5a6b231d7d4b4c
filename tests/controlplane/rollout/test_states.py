"""The rollout state machine: every allowed transition, and refusals that say why."""

from __future__ import annotations

import pytest

from controlplane.rollout.states import FINISHED, IllegalTransition, RolloutState, Slot, Strategy, transition

S = RolloutState


@pytest.mark.parametrize(
    ("state", "event", "after"),
    [
        (S.LOADING, "loaded", S.PROGRESSING),
        (S.LOADING, "load_failed", S.ROLLED_BACK),
        (S.LOADING, "switched", S.SUCCEEDED),
        (S.PROGRESSING, "step_passed", S.PROGRESSING),
        (S.PROGRESSING, "completed", S.SUCCEEDED),
        (S.PROGRESSING, "inconclusive", S.PAUSED),
        (S.PROGRESSING, "failed", S.ROLLED_BACK),
        (S.PROGRESSING, "pause", S.PAUSED),
        (S.PAUSED, "resume", S.PROGRESSING),
        (S.PAUSED, "promote", S.PROGRESSING),
        (S.PAUSED, "promote_all", S.SUCCEEDED),
        (S.PAUSED, "abort", S.ABORTED),
        (S.PROGRESSING, "rollback", S.ROLLED_BACK),
    ],
)
def test_allowed_transitions(state: RolloutState, event: str, after: RolloutState) -> None:
    assert transition(state, event) is after


def test_inconclusive_never_promotes_and_paused_waits_for_a_person() -> None:
    assert transition(S.PROGRESSING, "inconclusive") is S.PAUSED
    for event in ("step_passed", "completed", "loaded", "inconclusive", "failed"):
        with pytest.raises(IllegalTransition):
            transition(S.PAUSED, event)


@pytest.mark.parametrize("state", sorted(FINISHED))
def test_finished_rollouts_take_no_action(state: RolloutState) -> None:
    for event in ("promote", "pause", "resume", "abort", "rollback"):
        with pytest.raises(IllegalTransition, match="has finished"):
            transition(state, event)


def test_the_refusal_names_the_state_and_what_is_allowed() -> None:
    with pytest.raises(IllegalTransition, match="cannot resume a rollout that is progressing; allowed: abort"):
        transition(S.PROGRESSING, "resume")


def test_slots_and_strategies_are_the_strings_the_database_stores() -> None:
    assert [str(s) for s in Slot] == ["blue", "green"] and Slot("green").other is Slot.BLUE
    assert {"blue": 1}[Slot.BLUE] == 1  # a StrEnum keys dicts as its value does
    assert [str(s) for s in Strategy] == ["canary", "bluegreen", "rollback"]
