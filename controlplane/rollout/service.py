"""Rollout actions: deploy a new version, act on a rollout, one-click rollback, reload a slot.

Every action writes the model's desired state (and its audit event, through `audit`) in the
caller's transaction; the reconcilers make the engines follow. State changes go through
`rollout.lifecycle`; the controller step that moves rollouts by itself is `rollout.controller`, and
engine-wide desired state (batching limits, compaction) is `rollout.enginewide`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.clock import utcnow
from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.models import Deployment, Rollout
from controlplane.rollout import lifecycle
from controlplane.rollout.analysis import AnalysisPolicy
from controlplane.rollout.states import (
    ACTIVE,
    DEPLOY_STRATEGIES,
    IllegalTransition,
    RolloutState,
    Slot,
    Strategy,
    transition,
)
from controlplane.tracing import traced

# audit(session, action, target, outcome, detail): a change's 'ok' event, in its transaction. Refusals
# raise instead; the caller records them after rolling back (rollout.api._refusals_recorded).
Audit = Callable[[Session, str, str, str, dict[str, Any]], None]
DEFAULT_STEPS = (5, 25, 50, 100)


@dataclass(frozen=True)
class RolloutSettings:
    """Timing knobs for rollouts."""

    default_pause_s: float = 60.0
    scale_down_delay_s: float = 600.0  # the old stable version stays loaded this long after a rollout
    rollback_window_s: float = 7 * 24 * 3600.0  # a version stable this recently comes back without analysis
    # Every process writes a history row this often: a step whose rows do not yet cover its pause waits
    # up to two of these (plus its pause) for them before it is judged on what there is.
    history_interval_s: float = 10.0
    # A process whose heartbeat (engine_status) is older than this is gone: what it last reported neither
    # promotes a loading candidate nor rolls it back (controlplane.cluster: three FLIGHTDECK_HEARTBEAT_S).
    process_gone_after_s: float = 30.0


def active_rollout(session: Session, model: str) -> Rollout | None:
    """Return the model's rollout in progress, if any."""
    return session.scalars(
        select(Rollout).where(Rollout.model == model, Rollout.state.in_([s.value for s in ACTIVE]))
    ).first()


def deployed_check(sessions: sessionmaker[Session]) -> Callable[[str, str], bool]:
    """Return a check the registry calls before deleting: is this version in a slot or being rolled out?"""

    def deployed(name: str, version: str) -> bool:
        with sessions() as session:
            deployment = session.get(Deployment, name)
            if deployment is not None and version in (deployment.blue_version, deployment.green_version):
                return True
            rollout = active_rollout(session, name)
            return rollout is not None and rollout.to_version == version

    return deployed


@traced("rollout.deploy", "model", "version", "strategy")
def deploy(
    session: Session,
    model: str,
    version: str,
    actor: str,
    audit: Audit,
    *,
    strategy: str = Strategy.CANARY,
    steps: list[int] | None = None,
    pause_s: float | None = None,
    shadow: bool = False,
    policy: dict[str, Any] | None = None,
    settings: RolloutSettings = RolloutSettings(),
    now: datetime | None = None,
) -> Rollout:
    """Start moving `model` to `version`: load it into the idle slot; the controller does the rest."""
    now = now or utcnow()
    deployment = session.get(Deployment, model)
    if deployment is None:
        raise NotFound(f"model '{model}' is not deployed; its first deploy goes through first_deploy")
    if active_rollout(session, model) is not None:
        raise Conflict(f"model '{model}' already has a rollout in progress; promote, abort or roll it back first")
    stable = deployment.version_in(deployment.stable_slot)
    if version == stable:
        raise Conflict(f"version {version} is already the stable version of '{model}'")
    if strategy not in DEPLOY_STRATEGIES:
        raise ApiError(f"'strategy' must be canary or bluegreen, not {strategy!r}")
    strategy = Strategy(strategy)
    steps = [100] if strategy is Strategy.BLUEGREEN else list(steps or DEFAULT_STEPS)
    if not steps or steps != sorted(steps) or steps[-1] != 100 or any(not 0 < s <= 100 for s in steps):
        raise ApiError(f"'steps' must rise to 100, each between 1 and 100; got {steps}")
    try:
        checked = AnalysisPolicy.from_dict(policy)
    except (TypeError, ValueError) as exc:
        raise ApiError(f"'policy': {exc}") from None
    if shadow:
        steps = [0, *steps]  # a first step that only mirrors traffic: answers compared, never returned
    pause = settings.default_pause_s if pause_s is None else float(pause_s)
    if pause < 0:
        raise ApiError("'pause_s' must not be negative")
    candidate = Slot(deployment.stable_slot).other
    rollout = Rollout(
        model=model, from_version=stable, to_version=version, candidate_slot=candidate.value,
        strategy=strategy.value, steps=steps, step_index=0, pause_s=pause, shadow=shadow, policy=checked.to_dict(),
        created_by=actor, created_at=now,
    )  # fmt: skip
    lifecycle.start(rollout, "loading the candidate into the idle slot", now)
    session.add(rollout)
    changes = {f"{candidate}_version": version, **lifecycle.weights(candidate, 0)}
    lifecycle.set_desired(deployment, now, **changes, shadow_slot=None)
    session.flush()
    audit(
        session,
        "rollout.start",
        f"{model}:{version}",
        "ok",
        {"rollout": rollout.id, "strategy": strategy.value, "steps": steps},
    )
    return rollout


@traced("rollout.action", "rollout_id", "event")
def act(
    session: Session, rollout_id: int, event: str, actor: str, audit: Audit, now: datetime | None = None
) -> Rollout:
    """Apply a person's action to a rollout: promote, promote_all, pause, resume, abort."""
    now = now or utcnow()
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        raise NotFound(f"no rollout {rollout_id}")
    try:
        transition(RolloutState(rollout.state), event)  # refused before anything changes
    except IllegalTransition as exc:
        raise Conflict(str(exc)) from None
    if event == "abort":
        lifecycle.back_to_stable(session, rollout, "abort", f"aborted by {actor}", now)
    elif event == "promote_all":
        last = len(rollout.steps) - 1
        lifecycle.promote(session, rollout, last, now, f"promoted all the way by {actor}", ("promote", "promote_all"))
    elif event == "promote":
        index = min(rollout.step_index + 1, len(rollout.steps) - 1)
        lifecycle.promote(session, rollout, index, now, f"promoted by {actor}", ("promote", "promote_all"))
    else:  # pause, resume
        lifecycle.apply(rollout, event, f"{'paused' if event == 'pause' else 'resumed'} by {actor}", now)
        if event == "resume":
            rollout.step_started_at = now  # a fresh window, so the analysis sees only what follows
    audit(session, f"rollout.{event}", str(rollout_id), "ok", {"model": rollout.model, "state": rollout.state})
    return rollout


@dataclass(frozen=True)
class RollbackPlan:
    """What a rollback of a model would do now: stop `active`, or return to `version` in `slot`."""

    model: str
    version: str
    replacing: str | None  # the version that stops taking traffic
    slot: Slot
    active: Rollout | None = None  # the rollout in progress that the rollback stops
    last: Rollout | None = None  # else: the finished rollout it undoes
    reloaded: bool = False  # the version must be loaded again before traffic returns to it


def plan_rollback(
    session: Session, model: str, settings: RolloutSettings = RolloutSettings(), now: datetime | None = None
) -> RollbackPlan:
    """Say what a rollback would do now, or raise NotFound / Conflict saying why there is nothing to roll back."""
    now = now or utcnow()
    deployment = session.get(Deployment, model)
    if deployment is None:
        raise NotFound(f"model '{model}' has no deployment")
    rollout = active_rollout(session, model)
    if rollout is not None:
        stable = Slot(deployment.stable_slot)
        return RollbackPlan(model, rollout.from_version or "?", rollout.to_version, stable, active=rollout)
    last = session.scalars(
        select(Rollout)
        .where(
            Rollout.model == model,
            Rollout.state == RolloutState.SUCCEEDED.value,
            Rollout.strategy != Strategy.ROLLBACK.value,
        )
        .order_by(Rollout.finished_at.desc())
    ).first()
    if last is None or last.from_version is None:
        raise Conflict(f"model '{model}' has no earlier stable version to roll back to")
    if (now - last.finished_at).total_seconds() > settings.rollback_window_s:
        raise Conflict(
            f"version {last.from_version} of '{model}' was last stable over {settings.rollback_window_s / 3600:.0f} h "
            "ago; deploy it again (with analysis) instead"
        )
    current = Slot(deployment.stable_slot)
    if deployment.version_in(current) == last.from_version:
        raise Conflict(f"'{model}' already serves version {last.from_version}, the version before the last rollout")
    previous_slot = current.other
    reloaded = deployment.version_in(previous_slot) != last.from_version
    return RollbackPlan(
        model, last.from_version, deployment.version_in(current), previous_slot, last=last, reloaded=reloaded
    )


@traced("rollout.rollback", "model")
def rollback(
    session: Session,
    model: str,
    actor: str,
    audit: Audit,
    settings: RolloutSettings = RolloutSettings(),
    now: datetime | None = None,
) -> dict[str, Any]:
    """Return traffic to the last stable version at once; reload it first if it was scaled down."""
    now = now or utcnow()
    plan = plan_rollback(session, model, settings, now)
    if plan.active is not None:
        rollout = plan.active
        lifecycle.back_to_stable(session, rollout, "rollback", f"rolled back by {actor}", now)
        result = {"model": model, "version": rollout.from_version, "rollout": rollout.id, "reloaded": False}
        audit(session, "rollout.rollback", model, "ok", result)
        return result
    assert plan.last is not None
    deployment = session.get(Deployment, model)
    last, previous_slot, reloaded = plan.last, plan.slot, plan.reloaded
    record = Rollout(
        model=model, from_version=last.to_version, to_version=last.from_version,
        candidate_slot=previous_slot.value, strategy=Strategy.ROLLBACK.value, steps=[100], step_index=0,
        pause_s=0.0, shadow=False, policy={}, created_by=actor, created_at=now,
    )  # fmt: skip
    session.add(record)
    if reloaded:
        lifecycle.start(record, f"rollback by {actor}: reloading the previous version first", now)
        # Traffic stays where it is until the previous version is loaded and verified (see controller.tick).
        changes = {f"{previous_slot}_version": last.from_version, **lifecycle.weights(previous_slot, 0)}
        lifecycle.set_desired(deployment, now, **changes)
    else:  # still loaded and verified: traffic switches at once
        lifecycle.start(record, f"rollback by {actor}", now)
        lifecycle.promote(session, record, 0, now, f"rollback by {actor}", ("loaded", "switched"))
    session.flush()
    result = {"model": model, "version": last.from_version, "rollout": record.id, "reloaded": reloaded}
    audit(session, "rollout.rollback", model, "ok", result)
    return result


@traced("rollout.reload_slot", "model", "slot")
def reload_slot(
    session: Session, model: str, slot: str, actor: str, audit: Audit, now: datetime | None = None
) -> dict[str, Any]:
    """Ask every process to drain one slot and load and verify its version again; traffic returns after."""
    now = now or utcnow()
    if slot not in tuple(Slot):
        raise NotFound(f"no slot {slot!r}; use blue or green")
    slot = Slot(slot)
    deployment = session.get(Deployment, model)
    if deployment is None:
        raise NotFound(f"model '{model}' has no deployment")
    version, weight = deployment.version_in(slot), deployment.weights()[slot]
    if version is None:
        raise Conflict(f"'{model}' has nothing in {slot} to reload")
    if weight > 0 and deployment.version_in(slot.other) is None:
        raise Conflict(
            f"{slot} takes {weight}% of '{model}' traffic and {slot.other} is empty: nothing would serve while it "
            "reloads; deploy a version into the other slot first"
        )
    counter = getattr(Deployment, f"{slot}_reload")
    session.execute(
        update(Deployment)
        .where(Deployment.model == model)
        .values({"generation": Deployment.generation + 1, counter.key: counter + 1, "updated_at": now})
        .execution_options(synchronize_session=False)
    )
    deployment = session.get(Deployment, model, populate_existing=True)
    result = {"model": model, "slot": slot, "version": version, "generation": deployment.generation}
    audit(session, "slot.reload", f"{model}:{slot}", "ok", {**result, "weight": weight})
    return result
