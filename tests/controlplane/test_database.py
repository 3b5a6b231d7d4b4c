"""Alembic owns the schema; SQLite runs in WAL mode with a busy timeout; leases elect one scheduler."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from controlplane.db import SQLITE_BUSY_TIMEOUT_MS, make_engine, session_factory
from controlplane.migrate import upgrade
from controlplane.models import Base, Lease
from controlplane.scheduler import LeaderScheduler, release, try_acquire


def migrated(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'fd.db'}"
    upgrade(url)
    return make_engine(url)


def test_upgrading_an_empty_database_matches_the_models(tmp_path: Path) -> None:
    engine = migrated(tmp_path)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []
    assert "alembic_version" in inspect(engine).get_table_names()
    upgrade(str(engine.url))  # idempotent
    engine.dispose()


def test_sqlite_connections_use_wal_and_a_busy_timeout(tmp_path: Path) -> None:
    engine = migrated(tmp_path)
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() == SQLITE_BUSY_TIMEOUT_MS
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()


def test_one_holder_at_a_time_until_the_lease_expires_or_is_released(tmp_path: Path) -> None:
    engine = migrated(tmp_path)
    sessions = session_factory(engine)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions() as s:
        assert try_acquire(s, "scheduler", "a", 10, t0)
        assert not try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=5))
        assert try_acquire(s, "scheduler", "a", 10, t0 + timedelta(seconds=5))  # renewal
        assert not try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=14))
        assert try_acquire(s, "scheduler", "b", 10, t0 + timedelta(seconds=16))  # a's lease ran out
        assert not try_acquire(s, "scheduler", "a", 10, t0 + timedelta(seconds=17))
        release(s, "scheduler", "b")
        assert try_acquire(s, "scheduler", "a", 10, t0 + timedelta(seconds=18))
    engine.dispose()


def test_cluster_jobs_run_in_the_leader_only(tmp_path: Path) -> None:
    engine = migrated(tmp_path)
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
    second.shutdown()
    engine.dispose()


def test_lease_times_compare_as_moments_whatever_the_offset(tmp_path: Path) -> None:
    engine = migrated(tmp_path)
    sessions = session_factory(engine)
    plus_two = timezone(timedelta(hours=2))
    with sessions() as s:
        assert try_acquire(s, "scheduler", "a", 10, datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC))
        # 12:00:09 at +02:00 is 10:00:09 UTC: a's lease (until 10:00:10 UTC) still holds.
        assert not try_acquire(s, "scheduler", "b", 10, datetime(2026, 1, 1, 12, 0, 9, tzinfo=plus_two))
        lease = s.get(Lease, "scheduler")
        assert lease.expires_at == datetime(2026, 1, 1, 10, 0, 10, tzinfo=UTC)
    engine.dispose()
