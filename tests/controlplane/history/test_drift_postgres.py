"""Drift on a real PostgreSQL (a throwaway cluster, tests/pg.py): JSON summaries, the reference table, scores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from controlplane.history import drift
from controlplane.models import DriftReference
from tests.controlplane.history.test_drift_api import row


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
