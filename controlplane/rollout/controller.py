"""The rollout controller step (`tick`): the leader's job that moves rollouts along by itself.

Each step reads what the processes report (`slot_status`: did every one load and verify the
candidate?) and the history (how did the candidate do against the stable slot during its step?),
then changes each rollout's state through `rollout.lifecycle` and writes the next desired state in
the caller's transaction: loaded -> first step, analysis at each step's end, automatic rollback,
and the scale-down of old stable versions.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, exists, or_, select
from sqlalchemy.orm import Session, sessionmaker

from controlplane import quickread
from controlplane.clock import utcnow
from controlplane.cluster import heartbeats
from controlplane.history.query import SlotAggregate
from controlplane.models import Deployment, Rollout, RolloutMeasurement, SlotSample, SlotStatus
from controlplane.rollout import lifecycle
from controlplane.rollout.analysis import AnalysisPolicy, analyse
from controlplane.rollout.service import Audit, RolloutSettings, active_rollout
from controlplane.rollout.states import ACTIVE, RolloutState, Slot, Strategy, Verdict


def tick(
    session: Session, audit: Audit, settings: RolloutSettings | None = None, now: datetime | None = None
) -> list[str]:
    """Advance every rollout one step where it is due; return what happened (for logs and tests).

    Everything it does by itself is audited by `audit` (the `system` actor) with what caused it.
    """
    if not has_work(session):  # NOTE: the usual case, every second: one small read
        return []
    settings, now = settings or RolloutSettings(), now or utcnow()
    events: list[str] = []
    for rollout in session.scalars(select(Rollout).where(Rollout.state.in_([s.value for s in ACTIVE]))):
        if rollout.state == RolloutState.LOADING:
            events += _check_loaded(session, rollout, audit, now, settings)
        elif rollout.state == RolloutState.PROGRESSING:
            events += _analyse_step(session, rollout, audit, settings, now)
    events += _scale_down(session, audit, settings, now)
    return events


# A rollout in flight, or a version left in a slot that is not the stable one (a scale-down to come).
_HAS_WORK = select(
    or_(
        exists().where(Rollout.state.in_([s.value for s in ACTIVE])),
        exists().where(
            or_(
                and_(Deployment.stable_slot == Slot.BLUE.value, Deployment.green_version.is_not(None)),
                and_(Deployment.stable_slot == Slot.GREEN.value, Deployment.blue_version.is_not(None)),
            )
        ),
    )
)


def has_work(session: Session) -> bool:
    """Return whether `tick` could do anything now (`_HAS_WORK`): the leader ticks every second, and mostly
    nothing is in flight, so one small read stands in for the tick's reads."""
    return bool(session.scalar(_HAS_WORK))


def may_have_work(sessions: sessionmaker[Session]) -> bool:
    """`has_work`, asked before a session is opened (`quickread`): the leader asks every second."""
    return quickread.holds(sessions, _HAS_WORK)


def _check_loaded(
    session: Session, rollout: Rollout, audit: Audit, now: datetime, settings: RolloutSettings
) -> list[str]:
    """Take a loading candidate back out if a live process could not load it, else give it its first step."""
    statuses = list(
        session.scalars(
            select(SlotStatus).where(
                SlotStatus.model == rollout.model,
                SlotStatus.slot == rollout.candidate_slot,
                SlotStatus.version == rollout.to_version,
            )
        )
    )
    # NOTE: a process known to be gone (its heartbeat too old) says nothing any more; one with no heartbeat row
    # at all (a release before heartbeats) is still heard, as it was.
    beats = heartbeats(session)
    gone_after = timedelta(seconds=settings.process_gone_after_s)
    statuses = [s for s in statuses if s.process not in beats or now - beats[s.process] <= gone_after]
    failed = [s for s in statuses if s.state == "failed"]
    if failed:
        why = failed[0].error
        lifecycle.back_to_stable(session, rollout, "load_failed", why, now)
        detail = {"rollout": rollout.id, "verdict": "load_failed", "reason": why, "process": failed[0].process}
        audit(session, "rollout.auto_rollback", rollout.model, "ok", detail)
        return [f"{rollout.id}: rolled back: {why}"]
    if not any(s.state == "loaded" for s in statuses):
        return []
    if rollout.strategy == Strategy.ROLLBACK:
        reason = "previous version reloaded, verified and serving"
    else:
        reason = "loaded and verified; taking its first share of traffic"
    lifecycle.promote(session, rollout, 0, now, reason, ("loaded", "switched"))
    audit(
        session, "rollout.auto_promote", rollout.model, "ok",
        {"rollout": rollout.id, "verdict": "loaded", "reason": reason, "step": 1,
         "traffic_percent": rollout.steps[0], "state": rollout.state},
    )  # fmt: skip
    return [f"{rollout.id}: loaded -> {rollout.state}"]


# A look before a step's pause is over may end it early, on a failure only, at this share of alpha:
# each early look is one more chance of a false alarm, so it needs stronger evidence (as a sequential
# design's early boundary does); a pass always waits for the whole pause.
EARLY_ALPHA_SHARE = 0.1
ROW_START_TOLERANCE = timedelta(milliseconds=1)  # wall clock against monotonic interval lengths


def _window(
    session: Session, rollout: Rollout, deployment: Deployment, since: datetime
) -> tuple[SlotAggregate, SlotAggregate, datetime | None]:
    """The two slots' raw history rows of the step, added up; and the newest row's end.

    A row that began before the step's traffic split was written holds traffic of the previous split:
    it is left out. Each process's reconciler writes a row as soon as it moved the traffic
    (`on_traffic_moved`), so a step's rows begin when its split took effect, and nothing of it is lost
    to the sampling interval. A window restarted without a new split (resume) takes the rows that end
    after its start and began after the split.
    """
    candidate, stable = SlotAggregate(), SlotAggregate()
    covered: datetime | None = None
    split = min(since, deployment.updated_at) - ROW_START_TOLERANCE
    query = select(SlotSample).where(
        SlotSample.model == rollout.model, SlotSample.resolution_s == 0, SlotSample.ts > since
    )
    for row in session.scalars(query):
        if row.ts - timedelta(seconds=row.interval_s) < split:
            continue
        if row.slot == rollout.candidate_slot and row.version == rollout.to_version:
            candidate.add(row)
        elif row.slot == deployment.stable_slot and rollout.from_version in (None, row.version):
            stable.add(row)
        else:
            continue
        covered = row.ts if covered is None or row.ts > covered else covered
    return candidate, stable, covered


def _analyse_step(
    session: Session, rollout: Rollout, audit: Audit, settings: RolloutSettings, now: datetime
) -> list[str]:
    """Judge a step: fail rolls back, inconclusive pauses, pass takes the next step.

    A step is judged once its pause is over and its rows cover the pause (or two sampling intervals
    after that, on what there is). Before then a failure with stronger evidence ends it early.
    """
    since = rollout.step_started_at or rollout.created_at
    elapsed = (now - since).total_seconds()
    deployment = session.get(Deployment, rollout.model)
    policy = AnalysisPolicy.from_dict(rollout.policy, stored=True)
    candidate, stable, covered = _window(session, rollout, deployment, since)
    agreement = (candidate.shadow_agreed, candidate.shadow_compared) if candidate.shadow_compared else None
    early = elapsed < rollout.pause_s
    share = rollout.steps[rollout.step_index]
    if early:
        if not candidate.requests:
            return []
        result = analyse(candidate, stable, policy, agreement, alpha=policy.alpha * EARLY_ALPHA_SHARE, share=share)
        if result.verdict is not Verdict.FAIL:
            return []
    else:
        seen_s = (covered - since).total_seconds() if covered is not None else -1.0
        if seen_s < rollout.pause_s and elapsed < rollout.pause_s + 2 * settings.history_interval_s:
            return []  # the rows of the whole pause are still to come
        result = analyse(candidate, stable, policy, agreement, share=share)
    window = {
        "start": since.isoformat(), "end": covered.isoformat() if covered else None,
        "seconds": round((covered - since).total_seconds(), 3) if covered else 0.0,
        "early": early, "alpha": policy.alpha * (EARLY_ALPHA_SHARE if early else 1.0),
    }  # fmt: skip
    evidence = [{"check": "window", **window}, *result.evidence]
    session.add(
        RolloutMeasurement(
            rollout_id=rollout.id, step_index=rollout.step_index, ts=now, verdict=result.verdict.value,
            reasons=result.reasons, figures=result.figures, evidence=evidence,
        )
    )  # fmt: skip
    step = rollout.step_index + 1
    detail = {"rollout": rollout.id, "step": step, "verdict": result.verdict.value, "reasons": result.reasons,
              "figures": result.figures, "window_s": window["seconds"], "early": early}  # fmt: skip
    if result.verdict is Verdict.FAIL:
        reason = ("analysis failed early: " if early else "analysis failed: ") + "; ".join(result.reasons)
        lifecycle.back_to_stable(session, rollout, "failed", reason, now)
        audit(session, "rollout.auto_rollback", rollout.model, "ok", {**detail, "reason": reason})
    elif result.verdict is Verdict.INCONCLUSIVE:
        reason = "paused for a person: " + "; ".join(result.reasons)
        lifecycle.apply(rollout, "inconclusive", reason, now)
        audit(session, "rollout.auto_pause", rollout.model, "ok", {**detail, "reason": reason})
    else:
        reason = f"step {step} passed analysis"
        lifecycle.promote(session, rollout, rollout.step_index + 1, now, reason, ("step_passed", "completed"))
        audit(
            session, "rollout.auto_promote", rollout.model, "ok",
            {**detail, "reason": reason, "traffic_percent": rollout.steps[rollout.step_index], "state": rollout.state},
        )  # fmt: skip
    return [f"{rollout.id}: {result.verdict.value} -> {rollout.state}"]


def _scale_down(session: Session, audit: Audit, settings: RolloutSettings, now: datetime) -> list[str]:
    """Unload old stable versions that have idled past the scale-down delay."""
    events = []
    for deployment in session.scalars(select(Deployment)):
        idle = Slot(deployment.stable_slot).other
        if deployment.version_in(idle) is None or deployment.weights()[idle] > 0:
            continue
        if active_rollout(session, deployment.model) is not None:
            continue
        idle_s = (now - deployment.updated_at).total_seconds()
        if idle_s >= settings.scale_down_delay_s:
            version = deployment.version_in(idle)
            events.append(f"{deployment.model}: scaled down {version} from {idle}")
            lifecycle.set_desired(deployment, now, **{f"{idle}_version": None})
            audit(
                session, "deployment.scale_down", f"{deployment.model}:{version}", "ok",
                {"model": deployment.model, "version": version, "slot": idle.value, "verdict": "idle",
                 "reason": f"no traffic for {idle_s:.0f} s, past the scale-down delay of {settings.scale_down_delay_s:g} s"},
            )  # fmt: skip
    return events
