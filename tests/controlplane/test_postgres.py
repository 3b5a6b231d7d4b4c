"""The same migrations on a real PostgreSQL (a throwaway cluster, see tests/pg.py).

Mirrors test_database.py; the lease tests run on both backends in test_leases.py. Skipped only when
psycopg or the PostgreSQL server binaries are absent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")

from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import inspect  # noqa: E402

from controlplane.db import make_engine  # noqa: E402
from controlplane.migrate import alembic_config, upgrade  # noqa: E402
from controlplane.models import Base  # noqa: E402
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


@pytest.fixture
def pg_url(cluster: str) -> str:
    """A fresh, empty database."""
    return create_database(cluster)


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
