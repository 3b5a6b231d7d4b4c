"""The one writer of a rollout's state, and the traffic moves that go with each change.

`start` gives a new rollout its first state and `apply` every later one, checked against the
transition table (`states.transition`); both set the reason and the times, and log one line per
change. Nothing else assigns `Rollout.state`. `promote` and `back_to_stable` pair a state change with
the matching change to the model's desired state (its `deployments` row), so people's actions
(`rollout.service`) and the controller step (`rollout.controller`) move traffic the same way.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.models import Deployment, Rollout
from controlplane.rollout.states import FINISHED, INITIAL, RolloutState, Slot, transition

log = logging.getLogger(__name__)


def start(rollout: Rollout, reason: str, now: datetime) -> None:
    """Give a new rollout its first state: loading, since a candidate is verified before it takes traffic."""
    rollout.state, rollout.reason, rollout.updated_at, rollout.finished_at = INITIAL.value, reason, now, None
    log.info(
        "rollout of %s %s: starts %s: %s",
        rollout.model,
        rollout.to_version,
        INITIAL.value,
        reason,
        extra={"rollout_transition": (None, "start", INITIAL.value)},
    )


def apply(rollout: Rollout, event: str, reason: str, now: datetime) -> RolloutState:
    """Move a rollout to the state `event` leads to (IllegalTransition if none), with its reason; return it."""
    before = RolloutState(rollout.state)
    after = transition(before, event)
    rollout.state, rollout.reason, rollout.updated_at = after.value, reason, now
    if after in FINISHED:
        rollout.finished_at = now
    log.info(
        "rollout %s of %s: %s -> %s on %s: %s",
        rollout.id,
        rollout.model,
        before.value,
        after.value,
        event,
        reason,
        extra={"rollout_transition": (before.value, event, after.value)},
    )
    return after


def set_desired(deployment: Deployment, now: datetime, **changes: Any) -> None:
    """Change a model's desired state and bump its generation, so every process applies it."""
    for key, value in changes.items():
        setattr(deployment, key, value)
    deployment.generation += 1
    deployment.updated_at = now


def weights(slot: Slot, percent: int) -> dict[str, int]:
    """Return the weight columns that give `slot` `percent` of the traffic and the other slot the rest."""
    return {f"{slot}_weight": percent, f"{slot.other}_weight": 100 - percent}


def promote(
    session: Session, rollout: Rollout, index: int, now: datetime, reason: str, events: tuple[str, str]
) -> RolloutState:
    """Move the candidate to step `index`; `events` are (a step short of 100%, the last step) for the table."""
    # NOTE: the state changes first, so an illegal move raises before the desired state is touched.
    percent = rollout.steps[index]
    after = apply(rollout, events[1] if percent >= 100 else events[0], reason, now)
    rollout.step_index, rollout.step_started_at = index, now
    deployment = session.get(Deployment, rollout.model)
    candidate = Slot(rollout.candidate_slot)
    if percent >= 100:
        set_desired(deployment, now, **weights(candidate, 100), stable_slot=candidate.value, shadow_slot=None)
    else:
        shadow_slot = candidate.value if percent == 0 else None  # a 0% step only mirrors traffic
        set_desired(deployment, now, **weights(candidate, percent), shadow_slot=shadow_slot)
    return after


def back_to_stable(session: Session, rollout: Rollout, event: str, reason: str, now: datetime) -> RolloutState:
    """Send all traffic to the stable slot at once and take the candidate out (it is not retried by itself)."""
    after = apply(rollout, event, reason, now)
    deployment = session.get(Deployment, rollout.model)
    stable = Slot(deployment.stable_slot)
    set_desired(deployment, now, **weights(stable, 100), **{f"{stable.other}_version": None}, shadow_slot=None)
    return after
