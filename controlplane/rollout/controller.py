"""The rollout controller step (`tick`): the leader's job that moves rollouts along by itself.

Each step reads what the processes report (`slot_status`: did every one load and verify the
candidate?) and the history (how did the candidate do against the stable slot during its step?),
then changes each rollout's state through `rollout.lifecycle` and writes the next desired state in
the caller's transaction: loaded -> first step, analysis at each step's end, automatic rollback,
and the scale-down of old stable versions.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.clock import utcnow
from controlplane.history.query import SlotAggregate
from controlplane.models import Deployment, Rollout, RolloutMeasurement, SlotSample, SlotStatus
from controlplane.rollout import lifecycle
from controlplane.rollout.analysis import AnalysisPolicy, analyse
from controlplane.rollout.service import Audit, RolloutSettings, active_rollout
from controlplane.rollout.states import ACTIVE, RolloutState, Slot, Strategy, Verdict


def tick(
    session: Session, audit: Audit, settings: RolloutSettings | None = None, now: datetime | None = None
) -> list[str]:
    """Advance every rollout one step where it is due; return what happened (for logs and tests)."""
    settings, now = settings or RolloutSettings(), now or utcnow()
    events: list[str] = []
    for rollout in session.scalars(select(Rollout).where(Rollout.state.in_([s.value for s in ACTIVE]))):
        if rollout.state == RolloutState.LOADING:
            events += _check_loaded(session, rollout, audit, now)
        elif rollout.state == RolloutState.PROGRESSING:
            events += _analyse_step(session, rollout, audit, now)
    events += _scale_down(session, settings, now)
    return events


def _check_loaded(session: Session, rollout: Rollout, audit: Audit, now: datetime) -> list[str]:
    """Take a loading candidate back out if a process could not load it, else give it its first step."""
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
        why = failed[0].error
        lifecycle.back_to_stable(session, rollout, "load_failed", why, now)
        audit(session, "rollout.auto_rollback", rollout.model, "ok", {"rollout": rollout.id, "reason": why})
        return [f"{rollout.id}: rolled back: {why}"]
    if not any(s.state == "loaded" for s in statuses):
        return []
    if rollout.strategy == Strategy.ROLLBACK:
        reason = "previous version reloaded, verified and serving"
    else:
        reason = "loaded and verified; taking its first share of traffic"
    lifecycle.promote(session, rollout, 0, now, reason, ("loaded", "switched"))
    return [f"{rollout.id}: loaded -> {rollout.state}"]


def _analyse_step(session: Session, rollout: Rollout, audit: Audit, now: datetime) -> list[str]:
    """Judge a step whose pause is over: fail rolls back, inconclusive pauses, pass takes the next step."""
    if rollout.step_started_at and (now - rollout.step_started_at).total_seconds() < rollout.pause_s:
        return []
    deployment = session.get(Deployment, rollout.model)
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
        lifecycle.back_to_stable(session, rollout, "failed", reason, now)
        audit(session, "rollout.auto_rollback", rollout.model, "ok", {"rollout": rollout.id, "reason": reason})
    elif result.verdict is Verdict.INCONCLUSIVE:
        lifecycle.apply(rollout, "inconclusive", "paused for a person: " + "; ".join(result.reasons), now)
    else:
        reason = f"step {rollout.step_index + 1} passed analysis"
        lifecycle.promote(session, rollout, rollout.step_index + 1, now, reason, ("step_passed", "completed"))
    return [f"{rollout.id}: {result.verdict.value} -> {rollout.state}"]


def _aggregate(session: Session, model: str, version: str | None, slot: str, since: datetime) -> SlotAggregate:
    agg = SlotAggregate()
    query = select(SlotSample).where(SlotSample.model == model, SlotSample.slot == slot, SlotSample.ts > since)
    if version is not None:
        query = query.where(SlotSample.version == version)
    for row in session.scalars(query):
        agg.add(row)
    return agg


def _scale_down(session: Session, settings: RolloutSettings, now: datetime) -> list[str]:
    """Unload old stable versions that have idled past the scale-down delay."""
    events = []
    for deployment in session.scalars(select(Deployment)):
        idle = Slot(deployment.stable_slot).other
        if deployment.version_in(idle) is None or deployment.weights()[idle] > 0:
            continue
        if active_rollout(session, deployment.model) is not None:
            continue
        if (now - deployment.updated_at) >= timedelta(seconds=settings.scale_down_delay_s):
            events.append(f"{deployment.model}: scaled down {deployment.version_in(idle)} from {idle}")
            lifecycle.set_desired(deployment, now, **{f"{idle}_version": None})
    return events
