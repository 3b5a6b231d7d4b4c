"""The same migrations and lease logic on a real PostgreSQL (a throwaway cluster, see tests/pg.py).

Mirrors test_database.py. Skipped only when psycopg or the PostgreSQL server binaries are absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")

from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import Engine, inspect, select  # noqa: E402

from controlplane.db import make_engine, session_factory  # noqa: E402
from controlplane.migrate import alembic_config, upgrade  # noqa: E402
from controlplane.models import Base, Lease  # noqa: E402
from controlplane.scheduler import LeaderScheduler, release, try_acquire  # noqa: E402
from tests.pg import create_database, find_bindir, postgres_cluster  # noqa: E402

PG_BIN = find_bindir()
if PG_BIN is None:
    pytest.skip(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """One throwaway cluster for the module; each test gets its own database on it."""
    with postgres_cluster(PG_BIN) as url:
        yield url


# Sessions on the test databases default to a zone that is not UTC (+05:30, no DST), so the lease code
# is shown to compare instants and not to depend on the server's TimeZone setting.
SESSION_ZONE = "Asia/Kolkata"


@pytest.fixture
def pg_url(cluster: str) -> str:
    """A fresh, empty database whose sessions default to SESSION_ZONE."""
    return create_database(cluster, timezone=SESSION_ZONE)


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    """A fresh database upgraded to head."""
    upgrade(pg_url)
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def test_upgrading_an_empty_database_matches_the_models(pg_url: str) -> None:
    engine = make_engine(pg_url)
    assert inspect(engine).get_table_names() == []
    upgrade(pg_url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []
    assert sorted(inspect(engine).get_table_names()) == sorted([*Base.metadata.tables, "alembic_version"])
    columns = {column["name"]: column for column in inspect(engine).get_columns("leases")}
    assert columns["expires_at"]["type"].timezone and columns["acquired_at"]["type"].timezone
    upgrade(pg_url)  # idempotent
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_heads() == (
            ScriptDirectory.from_config(alembic_config(pg_url)).get_current_head(),
        )
    engine.dispose()


def test_one_holder_at_a_time_until_the_lease_expires_or_is_released(engine: Engine) -> None:
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
        lease = s.scalars(select(Lease)).one()
    # timestamptz comes back aware, in the session's zone, and the same instant (SQLite gives naive wall times).
    assert (lease.holder, lease.expires_at, lease.acquired_at) == ("a", t0 + timedelta(seconds=28), t0)
    assert lease.expires_at.utcoffset() == timedelta(0)  # UtcDateTime hands back UTC whatever the session zone


def test_a_lease_compares_instants_not_wall_clocks(engine: Engine) -> None:
    # PostgreSQL only: 12:00:09+02:00 is 10:00:09Z, inside a's lease. (SQLite drops the offset and compares
    # wall-clock strings, so there b would win; the product's clock is always UTC, which keeps SQLite right.)
    sessions = session_factory(engine)
    t0 = datetime(2026, 1, 1, 10, tzinfo=UTC)
    plus2 = timezone(timedelta(hours=2))
    with sessions() as s:
        assert try_acquire(s, "scheduler", "a", 10, t0)
        assert not try_acquire(s, "scheduler", "b", 10, datetime(2026, 1, 1, 12, 0, 9, tzinfo=plus2))
        assert try_acquire(s, "scheduler", "b", 10, datetime(2026, 1, 1, 12, 0, 11, tzinfo=plus2))


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
