"""Scheduled jobs: per-process jobs, and cluster-wide jobs that only the lease holder runs.

Every process (gunicorn worker, node) runs a scheduler; a row in `leases` elects one of them to
run the cluster-wide jobs, so several workers or nodes sharing a database never run them twice.
If the leader dies (even by SIGKILL, releasing nothing) its lease expires and another process
takes over within the lease time: a follower that found the lease held tries again at the moment
it expires, not only on its next renewal tick. A leader that cannot renew stops acting as one
before its lease can expire, so two leaders never overlap (given clocks that agree within
`CLOCK_MARGIN_S`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import case, insert, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.clock import utcnow
from controlplane.models import Lease

log = logging.getLogger(__name__)

CLOCK_MARGIN_S = 1.0  # how far nodes' clocks may disagree before a lease could be held twice
TAKEOVER_JOB = "lease-takeover"

Clock = Callable[[], datetime]


def try_acquire(session: Session, name: str, holder: str, ttl_s: float, now: datetime) -> bool:
    """Take or renew a lease atomically; return whether `holder` now holds it. Commits when it writes.

    A lease that another holder keeps is found by a read, which leaves the lease row loaded in `session`.
    """
    # NOTE: a follower asks every few seconds: trying the write first took the write lock and then raised an
    # IntegrityError on the insert (1.5 ms of CPU a renewal, against a read's 0.1 ms).
    lease = session.get(Lease, name, populate_existing=True)
    if lease is not None and lease.holder != holder and lease.expires_at >= now:
        return False
    expires = now + timedelta(seconds=ttl_s)
    # NOTE: acquired_at changes only when the lease changes hands (a takeover), not on a renewal: it says since
    # when the current holder leads. SET's right-hand sides read the row as it was before the update.
    result = session.execute(
        update(Lease)
        .where(Lease.name == name, (Lease.holder == holder) | (Lease.expires_at < now))
        .values(
            holder=holder, expires_at=expires, acquired_at=case((Lease.holder == holder, Lease.acquired_at), else_=now)
        )
    )
    if result.rowcount == 1:
        session.commit()
        return True
    try:
        session.execute(insert(Lease).values(name=name, holder=holder, expires_at=expires, acquired_at=now))
        session.commit()
        return True
    except IntegrityError:
        session.rollback()
        return False


def release(session: Session, name: str, holder: str) -> None:
    """Give a lease up so another process can take it at once. Commits."""
    session.execute(
        update(Lease)
        .where(Lease.name == name, Lease.holder == holder)
        .values(expires_at=datetime(1970, 1, 1, tzinfo=UTC))
    )
    session.commit()


class LeaderScheduler:
    """APScheduler plus a lease: `add_cluster_job` jobs run in the leader only."""

    LEASE = "scheduler"

    def __init__(
        self,
        sessions: sessionmaker[Session],
        ttl_s: float,
        clock: Clock = utcnow,
        process: str | None = None,
        on_renewed: Callable[[bool], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._on_renewed = on_renewed  # told after every renewal whether this process leads (a gauge)
        self._ttl_s = ttl_s
        self._clock = clock
        process = process or f"{socket.gethostname()}:{os.getpid()}"
        self.holder = f"{process}:{uuid.uuid4().hex[:8]}"
        self._leader = False
        self._leads_until = 0.0  # time.monotonic() after which this process stops acting as leader
        self._cluster_jobs: list[str] = []  # paused while this process follows (see _follow_or_lead)
        self._scheduler = BackgroundScheduler(timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1})

    @property
    def is_leader(self) -> bool:
        """Return whether this process holds the lease and it cannot have expired yet."""
        # NOTE: a renewal that stalls (database down, process paused) must not leave two leaders: ours
        # ends, by our own monotonic clock, before the lease's expiry that another process waits for.
        return self._leader and time.monotonic() < self._leads_until

    def renew(self) -> bool:
        """Take or keep the lease; return whether this process leads."""
        started = time.monotonic()
        expires_at = None
        try:
            with self._sessions() as session:
                now = self._clock()
                leader = try_acquire(session, self.LEASE, self.holder, self._ttl_s, now)
                if not leader:
                    lease = session.get(Lease, self.LEASE)
                    expires_at = lease.expires_at if lease is not None else None
        except Exception:
            log.exception("lease renewal failed; acting as follower")
            leader = False
        if leader:
            self._leads_until = started + self._ttl_s - min(CLOCK_MARGIN_S, self._ttl_s / 4)
        changed, self._leader = leader != self._leader, leader
        if changed:
            log.info("scheduler %s %s the lease", self.holder, "took" if leader else "lost")
            self._follow_or_lead(self._cluster_jobs, leader)  # NOTE: after _leader is set, for a job resumed at once
        if self._on_renewed is not None:
            self._on_renewed(leader)
        if expires_at is not None:
            self._try_again_at(expires_at)
        return leader

    def _try_again_at(self, expires_at: datetime) -> None:
        """Try for the lease once more the moment it expires, when that is before the next renewal tick."""
        wait_s = (expires_at - self._clock()).total_seconds() + 0.05
        if not self._scheduler.running or wait_s >= max(self._ttl_s / 3, 0.5):
            return
        run_date = utcnow() + timedelta(seconds=max(wait_s, 0))
        self._scheduler.add_job(self.renew, "date", run_date=run_date, id=TAKEOVER_JOB, replace_existing=True)

    def add_local_job(self, func: Callable[[], None], seconds: float, job_id: str) -> None:
        """Run `func` every `seconds` in this process; APScheduler's messages call it `job_id` ("alert-evaluator")."""
        self._scheduler.add_job(func, "interval", seconds=seconds, id=job_id, name=job_id, replace_existing=True)

    def add_cluster_job(self, func: Callable[[], None], seconds: float, job_id: str) -> None:
        """Run `func` every `seconds`, in the lease holder only."""

        def guarded() -> None:
            if self.is_leader:  # NOTE: a lease can run out between renewals, before the job is paused
                func()

        self.add_local_job(guarded, seconds, job_id)
        self._cluster_jobs.append(job_id)
        self._follow_or_lead([job_id], self._leader)

    def _follow_or_lead(self, job_ids: list[str], leader: bool) -> None:
        """Resume cluster jobs in the leader and pause them elsewhere.

        A follower's timers would only wake its threads to do nothing: a follower dispatched two jobs a
        second for that on an idle server. A resumed job's next run is its next interval from now.
        """
        for job_id in job_ids:
            if leader:
                self._scheduler.resume_job(job_id)
            else:
                self._scheduler.pause_job(job_id)

    def run_now(self, job_id: str) -> None:
        """Run a scheduled job once, now, in this thread (cluster jobs still only in the leader)."""
        job = self._scheduler.get_job(job_id)
        if job is None:
            raise KeyError(f"no scheduled job {job_id!r}")
        job.func()

    def start(self) -> None:
        """Take the lease if free and start the timers."""
        # NOTE: APScheduler's two INFO lines per job run stay below the WARNING its loggers get (logconfig).
        self.renew()
        self.add_local_job(self.renew, max(self._ttl_s / 3, 0.5), "lease-renewal")
        self._scheduler.start()

    def shutdown(self) -> None:
        """Stop the timers and hand the lease on."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        if self._leader:
            with self._sessions() as session:
                release(session, self.LEASE, self.holder)
            self._leader = False
            log.info("scheduler %s released the lease", self.holder)
        if self._on_renewed is not None:
            self._on_renewed(False)
