"""Rules with max/min/sum/last over a slot metric: one value per interval (its rows merged), then combined."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from alerts.catalogue import METRICS
from alerts.rules import parse_rule
from controlplane.alerting.observe import observe
from controlplane.models import SlotSample

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# (seconds before NOW, model, successes): mlp's first interval has two rows (two processes), merged into 7.
ROWS = [(50, "mlp", 3), (50, "textcls", 10), (50, "mlp", 4), (40, "mlp", 2), (30, "textcls", 1), (30, "mlp", 5)]
ROWS_OUTSIDE = [(400, "mlp", 100)]  # before the 5-minute window


def row(ago: int, model: str, successes: int) -> SlotSample:
    return SlotSample(
        ts=NOW - timedelta(seconds=ago), resolution_s=0, interval_s=10.0, process=f"n:{successes}", model=model,
        version="1", slot="blue", successes=successes,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("aggregation", "mlp", "textcls"), [("max", 7, 10), ("min", 2, 1), ("sum", 14, 11), ("last", 5, 1)]
)
def test_each_interval_is_merged_then_the_intervals_are_combined_in_time_order(
    sessions, aggregation: str, mlp: float, textcls: float
) -> None:
    rule = parse_rule(
        {
            "name": "r",
            "severity": "P2",
            "why": "a test",
            "summary": "s",
            "runbook": "rollback",
            "condition": {
                "metric": "requests",
                "aggregation": aggregation,
                "window": "5m",
                "op": ">",
                "threshold": 0,
                "by": ["model"],
            },
        },
        "test.yaml",
        METRICS,
    )
    with sessions() as session:
        session.add_all([row(*r) for r in ROWS + ROWS_OUTSIDE])
        session.commit()
        values = observe(session, rule, NOW, engine_ready=lambda: True, max_queue_size=128)
    assert values == {(("model", "mlp"),): mlp, (("model", "textcls"),): textcls}
