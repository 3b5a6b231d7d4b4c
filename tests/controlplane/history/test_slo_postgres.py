"""The SLO counts on a real PostgreSQL (a throwaway cluster, tests/pg.py): its JSON functions differ from SQLite's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")

from alerts.slo import SLI, SLO  # noqa: E402
from controlplane.db import make_engine, session_factory  # noqa: E402
from controlplane.history.slo import window_counts  # noqa: E402
from controlplane.migrate import upgrade  # noqa: E402
from tests.controlplane.history.conftest import T0, minutes, slot_row  # noqa: E402
from tests.pg import create_database, find_bindir, postgres_cluster  # noqa: E402

PG_BIN = find_bindir()
if PG_BIN is None:
    pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found", allow_module_level=True)


@pytest.fixture(scope="module")
def pg_sessions() -> Iterator:
    with postgres_cluster(PG_BIN) as cluster:
        url = create_database(cluster)
        upgrade(url)
        engine = make_engine(url)
        yield session_factory(engine)
        engine.dispose()


def test_latency_and_availability_counts_match_sqlites(pg_sessions) -> None:
    with pg_sessions() as s, s.begin():
        s.add(slot_row(T0 - minutes(1), [0.05] * 90 + [0.4] * 10, errors=3, client_errors=2, timeouts=4))
        s.add(slot_row(T0 - minutes(30), [0.05] * 50, errors=5, process="p2"))
        s.add(slot_row(T0 - minutes(1), [2.0] * 50, model="mlp"))
    latency = SLO("l", "textcls", SLI.LATENCY, 0.99, threshold_ms=250)
    availability = SLO("a", "textcls", SLI.AVAILABILITY, 0.999)
    windows = [minutes(5), timedelta(hours=1)]

    with pg_sessions() as s:
        five, hour = window_counts(s, latency, T0, windows)
        assert (five.good, five.total, hour.good, hour.total) == (90, 100, 140, 150)
        five, hour = window_counts(s, availability, T0, windows)
        assert (five.bad, five.total, hour.bad, hour.total) == (7, 104, 12, 154)
