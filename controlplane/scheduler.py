"""Scheduled jobs: per-process jobs, and cluster-wide jobs that only the lease holder runs.

Every process (gunicorn worker, node) runs a scheduler; a row in `leases` elects one of them to
run the cluster-wide jobs, so several workers or nodes sharing a database never run them twice.
If the leader dies its lease expires and another process takes over.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.models import Lease

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def try_acquire(session: Session, name: str, holder: str, ttl_s: float, now: datetime) -> bool:
    """Take or renew a lease atomically; return whether `holder` now holds it. Commits."""
    expires = now + timedelta(seconds=ttl_s)
    result = session.execute(
        update(Lease)
        .where(Lease.name == name, (Lease.holder == holder) | (Lease.expires_at < now))
        .values(holder=holder, expires_at=expires)
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

    def __init__(self, sessions: sessionmaker[Session], ttl_s: float, clock: Clock = utcnow) -> None:
        self._sessions = sessions
        self._ttl_s = ttl_s
        self._clock = clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.is_leader = False
        self._scheduler = BackgroundScheduler(timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1})

    def renew(self) -> bool:
        """Take or keep the lease; return whether this process leads."""
        try:
            with self._sessions() as session:
                leader = try_acquire(session, self.LEASE, self.holder, self._ttl_s, self._clock())
        except Exception:
            log.exception("lease renewal failed; acting as follower")
            leader = False
        if leader != self.is_leader:
            log.info("scheduler %s %s the lease", self.holder, "took" if leader else "lost")
        self.is_leader = leader
        return leader

    def add_local_job(self, func: Callable[[], None], seconds: float, job_id: str) -> None:
        """Run `func` every `seconds` in this process; APScheduler's messages call it `job_id` ("alert-evaluator")."""
        self._scheduler.add_job(func, "interval", seconds=seconds, id=job_id, name=job_id, replace_existing=True)

    def add_cluster_job(self, func: Callable[[], None], seconds: float, job_id: str) -> None:
        """Run `func` every `seconds`, in the lease holder only."""

        def guarded() -> None:
            if self.is_leader:
                func()

        self.add_local_job(guarded, seconds, job_id)

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
        if self.is_leader:
            with self._sessions() as session:
                release(session, self.LEASE, self.holder)
            self.is_leader = False
