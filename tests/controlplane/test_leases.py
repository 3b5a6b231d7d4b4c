"""Leases elect one scheduler: the same tests on SQLite and on a real PostgreSQL (tests/pg.py).

The PostgreSQL cases skip when psycopg or the server binaries are absent.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, select

from controlplane.db import make_engine, session_factory
from controlplane.migrate import upgrade
from controlplane.models import Lease
from controlplane.scheduler import LeaderScheduler, release, try_acquire
from tests.pg import create_database, find_bindir, postgres_cluster

# PostgreSQL sessions default to a zone that is not UTC (+05:30, no DST), so the lease code is shown
# to compare instants and not to depend on the server's TimeZone setting.
SESSION_ZONE = "Asia/Kolkata"


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[str]:
    """One throwaway PostgreSQL cluster for the module, started only when a PostgreSQL case runs."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg is not installed (pip install -e '.[postgres]')")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin"
        )
    with postgres_cluster(bindir) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A fresh database upgraded to head, on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fd.db'}"
    else:
        url = create_database(request.getfixturevalue("pg_cluster"), timezone=SESSION_ZONE)
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def test_one_holder_at_a_time_until_the_lease_expires_or_is_released(engine: Engine) -> None:
    sessions = session_factory(engine)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions() as s:
        assert try_acquire(s, "scheduler", "a", 10, t0)
        assert not try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=5))
        assert try_acquire(s, "scheduler", "a", 10, t0 + timedelta(seconds=5))  # renewal
        assert s.scalars(select(Lease)).one().acquired_at == t0  # a renewal keeps "since when"
        assert not try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=14))
        assert try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=16))  # a's lease ran out
        assert s.scalars(select(Lease)).one().acquired_at == t0 + timedelta(seconds=16)  # a takeover: b since now
        assert not try_acquire(s, "scheduler", "a", 10, t0 + timedelta(seconds=17))
        release(s, "scheduler", "b")
        assert try_acquire(s, "scheduler", "a", 10, t0 + timedelta(seconds=18))
        lease = s.scalars(select(Lease)).one()
    assert (lease.holder, lease.expires_at, lease.acquired_at) == (
        "a", t0 + timedelta(seconds=28), t0 + timedelta(seconds=18)
    )  # fmt: skip
    assert lease.expires_at.utcoffset() == timedelta(0)  # UtcDateTime hands back UTC whatever the session zone


def test_a_lease_held_by_another_is_found_by_one_read(engine: Engine) -> None:
    """A follower asks every few seconds: it must not take the write lock (or fail an insert) to hear "no"."""
    sessions = session_factory(engine)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions() as s:
        assert try_acquire(s, "scheduler", "a", 10, t0)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2].split()[0].upper()))
    with sessions() as s:
        assert not try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=5))
    assert statements == ["SELECT"]
    statements.clear()
    with sessions() as s:
        assert try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=11))  # ran out: taken by a write
    assert "UPDATE" in statements


def test_lease_times_compare_as_moments_whatever_the_offset(engine: Engine) -> None:
    sessions = session_factory(engine)
    plus_two = timezone(timedelta(hours=2))
    with sessions() as s:
        assert try_acquire(s, "scheduler", "a", 10, datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC))
        # 12:00:09 at +02:00 is 10:00:09 UTC: a's lease (until 10:00:10 UTC) still holds; 12:00:11 is past it.
        assert not try_acquire(s, "scheduler", "b", 10, datetime(2026, 1, 1, 12, 0, 9, tzinfo=plus_two))
        assert s.get(Lease, "scheduler").expires_at == datetime(2026, 1, 1, 10, 0, 10, tzinfo=UTC)
        assert try_acquire(s, "scheduler", "b", 10, datetime(2026, 1, 1, 12, 0, 11, tzinfo=plus_two))


def test_cluster_jobs_run_in_the_leader_only(engine: Engine) -> None:
    sessions = session_factory(engine)
    first, second = LeaderScheduler(sessions, ttl_s=30), LeaderScheduler(sessions, ttl_s=30)
    assert first.renew() and not second.renew()
    runs: list[str] = []
    for name, scheduler in (("first", first), ("second", second)):
        scheduler.add_cluster_job(lambda name=name: runs.append(name), 3600, "job")
    for scheduler in (first, second):
        scheduler.run_now("job")  # fire each process's timer once
    assert runs == ["first"]
    first.shutdown()  # hands the lease on
    assert second.renew()
    second.run_now("job")
    assert runs == ["first", "second"]
    second.shutdown()


def test_a_followers_cluster_jobs_are_paused_until_it_takes_the_lease(engine: Engine) -> None:
    """A follower's timers would wake its threads only for the guard to do nothing (two a second when idle)."""
    from apscheduler.events import EVENT_JOB_EXECUTED

    sessions = session_factory(engine)
    leader, follower = LeaderScheduler(sessions, ttl_s=30), LeaderScheduler(sessions, ttl_s=30)
    ran = {"leader": threading.Semaphore(0), "follower": threading.Semaphore(0)}
    dispatched: list[str] = []
    for name, scheduler in (("leader", leader), ("follower", follower)):
        scheduler.add_cluster_job(ran[name].release, 0.05, "job")
        scheduler._scheduler.add_listener(
            lambda e, name=name: dispatched.append(name) if e.job_id == "job" else None, EVENT_JOB_EXECUTED
        )
    leader.start()
    follower.start()
    try:
        assert leader.is_leader and not follower.is_leader
        for _ in range(5):
            assert ran["leader"].acquire(timeout=10), "the leader's job stopped running"
        assert "follower" not in dispatched  # its timer never fired, not even to skip
        leader.shutdown()  # hands the lease on
        assert follower.renew()
        assert ran["follower"].acquire(timeout=10), "the new leader's job did not start"
    finally:
        leader.shutdown()
        follower.shutdown()
