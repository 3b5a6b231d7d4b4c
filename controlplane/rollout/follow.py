"""Follow a rollout (or a first deploy) from outside the server until it ends: what `--wait` prints.

The CLI writes desired state to the database and returns; the serving processes load the version
and the leader's `rollout-controller` job moves the rollout along. Following is reading: each poll
opens a short session, compares what it sees with the last poll and reports each change (state,
step, traffic, every new analysis verdict). Nothing here advances a rollout, so with no server
running a rollout stays `loading` and the wait says so, then times out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.errors import NotFound
from controlplane.models import Lease, SlotStatus
from controlplane.rollout.readmodel import describe_rollout
from controlplane.rollout.states import FINISHED, RolloutState, Strategy

NO_LEADER_AFTER_S = 10.0  # a rollout still loading this long, with no live leader, gets a hint once


@dataclass(frozen=True)
class Outcome:
    """How a wait ended: `ok` when the rollout did what was asked; `reason` says why not."""

    ok: bool
    state: str
    reason: str
    timed_out: bool = False


def _leader_alive(session: Session, now: datetime) -> bool:
    lease = session.get(Lease, "scheduler")
    return lease is not None and lease.expires_at > now  # UtcDateTime: always an aware datetime


def succeeded(rollout: dict[str, Any], *, rollback: bool) -> bool:
    """Say whether a finished rollout did what its command asked (a rollback's own record, or an ended one)."""
    if rollout["strategy"] == Strategy.ROLLBACK:
        return rollout["state"] == RolloutState.SUCCEEDED  # the previous version reloaded and took the traffic
    if rollback:  # `rollback` of a rollout in flight: it ends rolled back, at once
        return rollout["state"] == RolloutState.ROLLED_BACK
    return rollout["state"] == RolloutState.SUCCEEDED


def follow_rollout(
    sessions: sessionmaker[Session],
    rollout_id: int,
    report: Callable[[str], None],
    *,
    rollback: bool = False,
    timeout_s: float = 600.0,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Poll a rollout until it finishes or `timeout_s` passes, reporting every change through `report`."""
    started, seen_state, seen_step, seen_verdicts, hinted = clock(), None, None, 0, False
    while True:
        with sessions() as session:
            rollout = describe_rollout(session, rollout_id)
            if rollout is None:
                raise NotFound(f"rollout {rollout_id} does not exist")
            leader = _leader_alive(session, datetime.now(UTC))
        step = (rollout["step_index"], rollout["traffic_percent"])
        if rollout["state"] != seen_state or step != seen_step:
            report(
                f"rollout {rollout_id}: {rollout['state']}, step {rollout['step_index'] + 1}/{len(rollout['steps'])}, "
                f"{rollout['traffic_percent']}% of traffic on version {rollout['to_version']}: {rollout['reason']}"
            )
            seen_state, seen_step = rollout["state"], step
        for m in rollout["measurements"][seen_verdicts:]:
            why = "; ".join(m["reasons"]) or "no findings"
            report(f"  analysis of step {m['step_index'] + 1}: {m['verdict']} ({why})")
        seen_verdicts = len(rollout["measurements"])
        if rollout["state"] in FINISHED:
            return Outcome(succeeded(rollout, rollback=rollback), rollout["state"], rollout["reason"])
        if rollout["state"] == RolloutState.PAUSED and not hinted:
            report(f"  paused: a person must act (flightdeck rollout act {rollout_id} resume|promote|abort)")
            hinted = True
        if not leader and not hinted and clock() - started > NO_LEADER_AFTER_S:
            report("  no server holds the scheduler lease: the rollout moves only while `flightdeck serve` runs")
            hinted = True
        if clock() - started >= timeout_s:
            return Outcome(False, rollout["state"], f"still {rollout['state']} after {timeout_s:g}s", timed_out=True)
        time.sleep(poll_s)  # NOTE: polling a separate process's progress; nothing in this process can signal it


def follow_first_deploy(
    sessions: sessionmaker[Session],
    model: str,
    version: str,
    report: Callable[[str], None],
    *,
    timeout_s: float = 600.0,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Poll the processes' slot reports until one serves `version` of `model`, or one fails to load it."""
    started = clock()
    seen: dict[str, str] = {}
    while True:
        with sessions() as session:
            query = select(SlotStatus).where(SlotStatus.model == model, SlotStatus.version == version)
            statuses = list(session.scalars(query))
        for s in statuses:
            if seen.get(s.process) != s.state:
                report(f"{s.process}: {s.state}" + (f" ({s.error})" if s.error else ""))
                seen[s.process] = s.state
        failed = [s for s in statuses if s.state == "failed"]
        if failed:
            return Outcome(False, "failed", f"{failed[0].process} could not load it: {failed[0].error}")
        if statuses and all(s.state == "loaded" for s in statuses):
            return Outcome(True, "loaded", f"{len(statuses)} process(es) serve version {version}")
        if clock() - started >= timeout_s:
            why = "no serving process reported it (is `flightdeck serve` running?)" if not statuses else "still loading"
            return Outcome(False, "loading", f"{why} after {timeout_s:g}s", timed_out=True)
        time.sleep(poll_s)
