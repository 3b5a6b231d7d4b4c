"""Drift on a real PostgreSQL (a throwaway cluster, tests/pg.py): JSON summaries, the reference table, scores."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")

from controlplane.db import make_engine, session_factory  # noqa: E402
from controlplane.history import drift  # noqa: E402
from controlplane.migrate import upgrade  # noqa: E402
from controlplane.models import DriftReference  # noqa: E402
from tests.controlplane.history.test_drift_api import row  # noqa: E402
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


def test_scores_and_a_pinned_reference_read_the_same_on_postgresql(pg_sessions) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    rng = np.random.default_rng(5)
    with pg_sessions() as s, s.begin():
        for minute in range(6):
            s.add(row(now - timedelta(days=3, minutes=-minute), rng.normal(1, 0.1, 100).tolist()))
        for minute in range(3):
            s.add(row(now - timedelta(minutes=30 - minute), rng.normal(3, 0.1, 100).tolist()))
    with pg_sessions() as s:
        found = drift.describe(s, "mlp", now - timedelta(hours=1), now)
        scores = {x["kind"]: x["score"] for x in found["versions"][0]["scores"]}
        assert found["versions"][0]["reference"]["source"] == "first_day" and scores["input"] > 0.9
        seen = drift.drift_observation(s, timedelta(hours=1), ("model", "feature"), 50, now)
        assert seen[(("model", "mlp"), ("feature", "input:input"))] > 0.9
    with pg_sessions() as s, s.begin():  # "end" is a reserved word in PostgreSQL: the column must be quoted
        s.add(DriftReference(model="mlp", version="1", start=now - timedelta(minutes=40), end=now,
                             pinned_by="otto", pinned_at=now))  # fmt: skip
    with pg_sessions() as s:
        reference, scored = drift.drift(s, "mlp", "1", now - timedelta(hours=1), now)
    assert reference.source == "pinned" and reference.end == now and all(x.score == 0.0 for x in scored)
