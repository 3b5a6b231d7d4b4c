"""Rollout actions and the controller step. Every action writes desired state (and its audit event,
through `audit`) in the caller's transaction; the reconcilers make the engines follow.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.history.query import SlotAggregate
from controlplane.models import (
    Deployment,
    EngineDesired,
    EngineStatus,
    Rollout,
    RolloutMeasurement,
    SlotSample,
    SlotStatus,
)
from controlplane.rollout.analysis import AnalysisPolicy, analyse
from controlplane.rollout.states import ACTIVE, IllegalTransition, RolloutState, Verdict, transition
from controlplane.scheduler import utcnow

log = logging.getLogger(__name__)

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


def other(slot: str) -> str:
    return "green" if slot == "blue" else "blue"


def _set(deployment: Deployment, now: datetime, **changes: Any) -> None:
    for key, value in changes.items():
        setattr(deployment, key, value)
    deployment.generation += 1
    deployment.updated_at = now


def _weights(candidate_slot: str, percent: int) -> dict[str, int]:
    return {f"{candidate_slot}_weight": percent, f"{other(candidate_slot)}_weight": 100 - percent}


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


def deploy(
    session: Session,
    model: str,
    version: str,
    actor: str,
    audit: Audit,
    *,
    strategy: str = "canary",
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
    if strategy not in ("canary", "bluegreen"):
        raise ApiError(f"'strategy' must be canary or bluegreen, not {strategy!r}")
    steps = [100] if strategy == "bluegreen" else list(steps or DEFAULT_STEPS)
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
    candidate = other(deployment.stable_slot)
    rollout = Rollout(
        model=model,
        from_version=stable,
        to_version=version,
        candidate_slot=candidate,
        strategy=strategy,
        steps=steps,
        step_index=0,
        pause_s=pause,
        shadow=shadow,
        policy=checked.to_dict(),
        state=RolloutState.LOADING.value,
        reason="loading the candidate into the idle slot",
        created_by=actor,
        created_at=now,
        updated_at=now,
    )
    session.add(rollout)
    _set(deployment, now, **{f"{candidate}_version": version}, **_weights(candidate, 0), shadow_slot=None)
    session.flush()
    audit(
        session,
        "rollout.start",
        f"{model}:{version}",
        "ok",
        {"rollout": rollout.id, "strategy": strategy, "steps": steps},
    )
    return rollout


def _finish(rollout: Rollout, state: RolloutState, reason: str, now: datetime) -> None:
    rollout.state, rollout.reason, rollout.updated_at, rollout.finished_at = state.value, reason, now, now


def _back_to_stable(session: Session, rollout: Rollout, state: RolloutState, reason: str, now: datetime) -> None:
    """Send all traffic to the stable slot at once and take the candidate out (it is not retried by itself)."""
    deployment = session.get(Deployment, rollout.model)
    stable = deployment.stable_slot
    _set(deployment, now, **_weights(stable, 100), **{f"{other(stable)}_version": None}, shadow_slot=None)
    _finish(rollout, state, reason, now)


def act(
    session: Session, rollout_id: int, event: str, actor: str, audit: Audit, now: datetime | None = None
) -> Rollout:
    """Apply a person's action to a rollout: promote, promote_all, pause, resume, abort."""
    now = now or utcnow()
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        raise NotFound(f"no rollout {rollout_id}")
    try:
        target = transition(RolloutState(rollout.state), event)
    except IllegalTransition as exc:
        raise Conflict(str(exc)) from None
    if event == "abort":
        _back_to_stable(session, rollout, target, f"aborted by {actor}", now)
    elif event == "promote_all":
        _promote(session, rollout, len(rollout.steps) - 1, now, f"promoted all the way by {actor}")
    elif event == "promote":
        _promote(session, rollout, min(rollout.step_index + 1, len(rollout.steps) - 1), now, f"promoted by {actor}")
    else:  # pause, resume
        rollout.state, rollout.updated_at = target.value, now
        rollout.reason = f"{'paused' if event == 'pause' else 'resumed'} by {actor}"
        if event == "resume":
            rollout.step_started_at = now  # a fresh window, so the analysis sees only what follows
    audit(session, f"rollout.{event}", str(rollout_id), "ok", {"model": rollout.model, "state": rollout.state})
    return rollout


def _promote(session: Session, rollout: Rollout, index: int, now: datetime, reason: str) -> None:
    deployment = session.get(Deployment, rollout.model)
    percent = rollout.steps[index]
    rollout.step_index, rollout.step_started_at, rollout.updated_at, rollout.reason = index, now, now, reason
    if percent >= 100:
        _set(
            deployment,
            now,
            **_weights(rollout.candidate_slot, 100),
            stable_slot=rollout.candidate_slot,
            shadow_slot=None,
        )
        _finish(rollout, RolloutState.SUCCEEDED, reason, now)
    else:
        rollout.state = RolloutState.PROGRESSING.value
        shadow_slot = rollout.candidate_slot if percent == 0 else None
        _set(deployment, now, **_weights(rollout.candidate_slot, percent), shadow_slot=shadow_slot)


@dataclass(frozen=True)
class RollbackPlan:
    """What a rollback of a model would do now: stop `active`, or return to `version` in `slot`."""

    model: str
    version: str
    replacing: str | None  # the version that stops taking traffic
    slot: str
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
        stable = deployment.stable_slot
        return RollbackPlan(model, rollout.from_version or "?", rollout.to_version, stable, active=rollout)
    last = session.scalars(
        select(Rollout)
        .where(Rollout.model == model, Rollout.state == RolloutState.SUCCEEDED.value, Rollout.strategy != "rollback")
        .order_by(Rollout.finished_at.desc())
    ).first()
    if last is None or last.from_version is None:
        raise Conflict(f"model '{model}' has no earlier stable version to roll back to")
    if (now - last.finished_at).total_seconds() > settings.rollback_window_s:
        raise Conflict(
            f"version {last.from_version} of '{model}' was last stable over {settings.rollback_window_s / 3600:.0f} h "
            "ago; deploy it again (with analysis) instead"
        )
    current = deployment.stable_slot
    if deployment.version_in(current) == last.from_version:
        raise Conflict(f"'{model}' already serves version {last.from_version}, the version before the last rollout")
    previous_slot = other(current)
    reloaded = deployment.version_in(previous_slot) != last.from_version
    return RollbackPlan(
        model, last.from_version, deployment.version_in(current), previous_slot, last=last, reloaded=reloaded
    )


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
        _back_to_stable(session, rollout, RolloutState.ROLLED_BACK, f"rolled back by {actor}", now)
        result = {"model": model, "version": rollout.from_version, "rollout": rollout.id, "reloaded": False}
        audit(session, "rollout.rollback", model, "ok", result)
        return result
    assert plan.last is not None
    deployment = session.get(Deployment, model)
    last, previous_slot, reloaded = plan.last, plan.slot, plan.reloaded
    record = Rollout(
        model=model, from_version=last.to_version, to_version=last.from_version, candidate_slot=previous_slot,
        strategy="rollback", steps=[100], step_index=0, pause_s=0.0, shadow=False, policy={},
        state=RolloutState.LOADING.value if reloaded else RolloutState.SUCCEEDED.value,
        reason=f"rollback by {actor}" + (": reloading the previous version first" if reloaded else ""),
        created_by=actor, created_at=now, updated_at=now, finished_at=None if reloaded else now,
    )  # fmt: skip
    session.add(record)
    if reloaded:
        # Traffic stays where it is until the previous version is loaded and verified (see tick()).
        _set(deployment, now, **{f"{previous_slot}_version": last.from_version}, **_weights(previous_slot, 0))
    else:
        _set(deployment, now, **_weights(previous_slot, 100), stable_slot=previous_slot)
    session.flush()
    result = {"model": model, "version": last.from_version, "rollout": record.id, "reloaded": reloaded}
    audit(session, "rollout.rollback", model, "ok", result)
    return result


def _aggregate(session: Session, model: str, version: str | None, slot: str, since: datetime) -> SlotAggregate:
    agg = SlotAggregate()
    query = select(SlotSample).where(SlotSample.model == model, SlotSample.slot == slot, SlotSample.ts > since)
    if version is not None:
        query = query.where(SlotSample.version == version)
    for row in session.scalars(query):
        agg.add(row)
    return agg


def tick(
    session: Session, audit: Audit, settings: RolloutSettings = RolloutSettings(), now: datetime | None = None
) -> list[str]:
    """Advance every rollout one step where it is due; return what happened (for logs and tests)."""
    now = now or utcnow()
    events: list[str] = []
    for rollout in session.scalars(select(Rollout).where(Rollout.state.in_([s.value for s in ACTIVE]))):
        deployment = session.get(Deployment, rollout.model)
        if rollout.state == RolloutState.LOADING.value:
            statuses = list(
                session.scalars(
                    select(SlotStatus).where(
                        SlotStatus.model == rollout.model,
                        SlotStatus.slot == rollout.candidate_slot,
                        SlotStatus.version == rollout.to_version,
                    )
                )
            )
            failed = [s for s in statuses if s.state == "failed"]
            if failed:
                _back_to_stable(session, rollout, RolloutState.ROLLED_BACK, failed[0].error, now)
                audit(
                    session,
                    "rollout.auto_rollback",
                    rollout.model,
                    "ok",
                    {"rollout": rollout.id, "reason": failed[0].error},
                )
                events.append(f"{rollout.id}: rolled back: {failed[0].error}")
            elif any(s.state == "loaded" for s in statuses):
                if rollout.strategy == "rollback":
                    _set(deployment, now, **_weights(rollout.candidate_slot, 100), stable_slot=rollout.candidate_slot)
                    _finish(rollout, RolloutState.SUCCEEDED, "previous version reloaded, verified and serving", now)
                else:
                    _promote(session, rollout, 0, now, "loaded and verified; taking its first share of traffic")
                events.append(f"{rollout.id}: loaded -> {rollout.state}")
            continue
        if rollout.state != RolloutState.PROGRESSING.value:
            continue
        if rollout.step_started_at and (now - rollout.step_started_at).total_seconds() < rollout.pause_s:
            continue
        policy = AnalysisPolicy.from_dict(rollout.policy)
        since = rollout.step_started_at or rollout.created_at
        candidate = _aggregate(session, rollout.model, rollout.to_version, rollout.candidate_slot, since)
        stable = _aggregate(session, rollout.model, rollout.from_version, deployment.stable_slot, since)
        agreement = (candidate.shadow_agreed, candidate.shadow_compared) if candidate.shadow_compared else None
        result = analyse(candidate, stable if stable.requests else None, policy, agreement)
        session.add(
            RolloutMeasurement(
                rollout_id=rollout.id, step_index=rollout.step_index, ts=now, verdict=result.verdict.value,
                reasons=result.reasons, figures=result.figures,
            )
        )  # fmt: skip
        if result.verdict is Verdict.FAIL:
            reason = "analysis failed: " + "; ".join(result.reasons)
            _back_to_stable(session, rollout, RolloutState.ROLLED_BACK, reason, now)
            audit(session, "rollout.auto_rollback", rollout.model, "ok", {"rollout": rollout.id, "reason": reason})
        elif result.verdict is Verdict.INCONCLUSIVE:
            rollout.state, rollout.updated_at = RolloutState.PAUSED.value, now
            rollout.reason = "paused for a person: " + "; ".join(result.reasons)
        else:
            _promote(session, rollout, rollout.step_index + 1, now, f"step {rollout.step_index + 1} passed analysis")
        events.append(f"{rollout.id}: {result.verdict.value} -> {rollout.state}")
    events += _scale_down(session, settings, now)
    return events


def _scale_down(session: Session, settings: RolloutSettings, now: datetime) -> list[str]:
    """Unload old stable versions that have idled past the scale-down delay."""
    events = []
    for deployment in session.scalars(select(Deployment)):
        idle = other(deployment.stable_slot)
        if deployment.version_in(idle) is None or deployment.weights()[idle] > 0:
            continue
        if active_rollout(session, deployment.model) is not None:
            continue
        if (now - deployment.updated_at) >= timedelta(seconds=settings.scale_down_delay_s):
            events.append(f"{deployment.model}: scaled down {deployment.version_in(idle)} from {idle}")
            _set(deployment, now, **{f"{idle}_version": None})
    return events


# -- engine-wide desired state: batching limits, memory compaction, slot reloads ---------------

BATCHING_LIMITS = ("max_batch_size", "max_queue_delay_ms", "max_queue_size")
HEARD_FROM_S = 60.0  # a process whose engine_status is older than this is taken to be gone


def check_batching(body: dict[str, Any]) -> dict[str, int | float | None]:
    """Validate a batching change: any of max_batch_size >= 1, max_queue_delay_ms >= 0, max_queue_size >= 1.

    A null value hands that limit back to each process's own setting.
    """
    unknown = sorted(set(body) - set(BATCHING_LIMITS))
    if unknown:
        raise ApiError(f"unknown batching limit(s) {unknown}; use {list(BATCHING_LIMITS)}")
    if not body:
        raise ApiError(f"give at least one of {list(BATCHING_LIMITS)}")
    changes: dict[str, int | float | None] = {}
    for key, value in body.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is None:
            changes[key] = None
        elif key == "max_queue_delay_ms":
            if not number or not math.isfinite(value) or value < 0:
                raise ApiError(f"'max_queue_delay_ms' must be a number of at least 0 (or null), not {value!r}")
            changes[key] = float(value)
        else:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ApiError(f"'{key}' must be an integer of at least 1 (or null), not {value!r}")
            changes[key] = value
    return changes


def engine_desired(session: Session, now: datetime | None = None) -> EngineDesired:
    """Return the engine-wide desired state (its one row), creating it if the database lacks it."""
    desired = session.get(EngineDesired, 1)
    if desired is None:
        desired = EngineDesired(id=1, generation=1, compact_generation=0, updated_at=now or utcnow(), updated_by="")
        session.add(desired)
        session.flush()
    return desired


def effective_batching(desired: EngineDesired, own: dict[str, Any]) -> dict[str, Any]:
    """The limits in force: the desired ones, each null one replaced by `own` (a process's settings)."""
    return {key: own[key] if getattr(desired, key) is None else getattr(desired, key) for key in BATCHING_LIMITS}


def _bump_engine(session: Session, actor: str, now: datetime, counter: str, **changes: Any) -> EngineDesired:
    # NOTE: one UPDATE adding 1 in the database, so two writers at once never hand out the same generation.
    engine_desired(session, now)
    column = getattr(EngineDesired, counter)
    session.execute(
        update(EngineDesired)
        .where(EngineDesired.id == 1)
        .values({counter: column + 1, "updated_at": now, "updated_by": actor[:128], **changes})
        .execution_options(synchronize_session=False)
    )
    return session.get(EngineDesired, 1, populate_existing=True)


def set_engine_batching(
    session: Session,
    changes: dict[str, int | float | None],
    actor: str,
    audit: Audit,
    own: dict[str, Any],
    now: datetime | None = None,
) -> dict[str, Any]:
    """Write new batching limits for every process (generation bumped); return the generation and limits in force."""
    desired = _bump_engine(session, actor, now or utcnow(), "generation", **changes)
    result = {"generation": desired.generation, "batching": effective_batching(desired, own)}
    audit(session, "engine.batching", "engine", "ok", {"changes": changes, **result})
    return result


def request_compaction(session: Session, actor: str, audit: Audit, now: datetime | None = None) -> dict[str, int]:
    """Ask every process to compact its memory once (compact_generation bumped)."""
    desired = _bump_engine(session, actor, now or utcnow(), "compact_generation")
    result = {"compact_generation": desired.compact_generation}
    audit(session, "engine.compact", "engine", "ok", result)
    return result


def engine_processes(session: Session, now: datetime | None = None) -> list[EngineStatus]:
    """The engine_status rows of processes heard from in the last HEARD_FROM_S seconds."""
    since = (now or utcnow()) - timedelta(seconds=HEARD_FROM_S)
    return list(
        session.scalars(select(EngineStatus).where(EngineStatus.updated_at >= since).order_by(EngineStatus.process))
    )


def reload_slot(
    session: Session, model: str, slot: str, actor: str, audit: Audit, now: datetime | None = None
) -> dict[str, Any]:
    """Ask every process to drain one slot and load and verify its version again; traffic returns after."""
    now = now or utcnow()
    if slot not in ("blue", "green"):
        raise NotFound(f"no slot {slot!r}; use blue or green")
    deployment = session.get(Deployment, model)
    if deployment is None:
        raise NotFound(f"model '{model}' has no deployment")
    version, weight = deployment.version_in(slot), deployment.weights()[slot]
    if version is None:
        raise Conflict(f"'{model}' has nothing in {slot} to reload")
    if weight > 0 and deployment.version_in(other(slot)) is None:
        raise Conflict(
            f"{slot} takes {weight}% of '{model}' traffic and {other(slot)} is empty: nothing would serve while it "
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
