"""Alembic owns the schema; SQLite runs in WAL mode with a busy timeout. (Leases: test_leases.py, both backends.)"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text

from controlplane.db import SQLITE_BUSY_TIMEOUT_MS, make_engine
from controlplane.migrate import upgrade
from controlplane.models import Base, SlotSample
from tests.controlplane.history.conftest import slot_row


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


def test_a_new_home_and_its_database_are_private_whatever_the_umask(tmp_path: Path, caplog) -> None:
    import os
    import stat

    from controlplane.config import load_settings
    from controlplane.modelstore import loosened_paths, prepare_home

    settings = load_settings(environ={}, overrides={"home": str(tmp_path / "home")})
    previous = os.umask(0o022)  # a typical login shell's: files 0644, folders 0755
    try:
        prepare_home(settings)
        upgrade(settings.sqlalchemy_url)
        engine = make_engine(settings.sqlalchemy_url)
        with engine.connect() as connection:  # the -wal and -shm files exist while a connection is open
            connection.execute(text("INSERT INTO leases VALUES ('x', 'y', '2026-01-01', '2026-01-01')"))
            connection.commit()
            home = settings.home
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in home.iterdir() if p.is_file()}
            assert modes == {
                "flightdeck.db": 0o600,
                "flightdeck.db-wal": 0o600,
                "flightdeck.db-shm": 0o600,
                "session-secret": 0o600,
                "secret.key": 0o600,  # the receiver secrets' key
            }
            assert stat.S_IMODE(home.stat().st_mode) == 0o700
            assert loosened_paths(home) == []
        engine.dispose()
    finally:
        os.umask(previous)
    # A file someone loosened is reported at the next start.
    (settings.home / "flightdeck.db").chmod(0o644)
    settings.home.chmod(0o755)
    with caplog.at_level("WARNING", logger="controlplane.modelstore"):
        prepare_home(settings)
    assert loosened_paths(settings.home) == [settings.home, settings.home / "flightdeck.db"]
    assert sum("open to other OS users" in r.getMessage() for r in caplog.records) == 2


def test_json_columns_read_back_what_was_written_even_nan_and_infinity(sessions) -> None:
    """Decoded by orjson, which refuses the NaN and Infinity that the standard library's encoder writes."""
    summary = {"input": {"n": 2, "sum": float("nan"), "sumsq": float("inf"), "bins": {"p0": 2}}}
    written = slot_row(datetime(2026, 12, 1, tzinfo=UTC), [0.01, 0.02])
    written.label_counts, written.input_summaries = {"out": {"cat": 2}}, summary
    latencies = dict(written.latency_hist)
    with sessions() as session, session.begin():
        session.add(written)
    with sessions() as session:
        row = session.scalars(select(SlotSample)).one()
    read = row.input_summaries["input"]
    assert math.isnan(read["sum"]) and read["sumsq"] == math.inf and read["bins"] == {"p0": 2}
    assert row.latency_hist == latencies and latencies and row.label_counts == {"out": {"cat": 2}}
