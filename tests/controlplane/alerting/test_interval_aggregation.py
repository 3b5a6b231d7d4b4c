"""Rules with max/min/sum/last over a slot metric: one value per interval (its rows merged), then combined."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from alerts.catalogue import METRICS, SLOT_METRICS
from alerts.rules import LIVE_METRICS, load_rules, parse_rule
from controlplane.alerting.observe import observe, observe_all
from controlplane.models import SlotSample

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# (seconds before NOW, model, successes): mlp's first interval has two rows (two processes), merged into 7.
ROWS = [(50, "mlp", 3), (50, "textcls", 10), (50, "mlp", 4), (40, "mlp", 2), (30, "textcls", 1), (30, "mlp", 5)]
ROWS_OUTSIDE = [(400, "mlp", 100)]  # before the 5-minute window
RULE = {
    "name": "r",
    "severity": "P2",
    "why": "a test",
    "summary": "s",
    "runbook": "rollback",
    "condition": {
        "metric": "requests",
        "aggregation": "max",
        "window": "5m",
        "op": ">",
        "threshold": 0,
        "by": ["model"],
    },
}


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
    rule = parse_rule({**RULE, "condition": {**RULE["condition"], "aggregation": aggregation}}, "test.yaml", METRICS)
    with sessions() as session:
        session.add_all([row(*r) for r in ROWS + ROWS_OUTSIDE])
        session.commit()
        values = observe(session, rule, NOW, engine_ready=lambda: True, max_queue_size=128)
    assert values == {(("model", "mlp"),): mlp, (("model", "textcls"),): textcls}


def test_every_slot_rule_from_one_reading_equals_each_rule_reading_its_own_window(sessions) -> None:
    # The shipped rules (5 and 15 minute windows, avg/max, by model/version/slot/reason, queue fill) and the
    # four interval aggregations over 1 h, on rows of two models, two versions and two processes.
    rules = [
        r
        for r in load_rules(Path(str(files("alerts") / "rules")), [*METRICS, *LIVE_METRICS])
        if r.condition.metric in SLOT_METRICS or r.condition.metric == "queue_fill"
    ]
    for aggregation in ("max", "min", "sum", "last"):
        rules.append(
            parse_rule(
                {
                    **RULE,
                    "name": aggregation,
                    "condition": {**RULE["condition"], "aggregation": aggregation, "window": "1h"},
                },
                "t.yaml",
                METRICS,
            )
        )
    assert len(rules) >= 10 and {r.condition.window for r in rules} >= {timedelta(minutes=5), timedelta(hours=1)}
    rng = np.random.default_rng(5)
    rows = []
    for ago in range(5, 4000, 10):
        for model, version, process in (("mlp", "1", "a"), ("mlp", "2", "b"), ("textcls", "1", "a")):
            requests = int(rng.integers(0, 50))
            rows.append(
                SlotSample(
                    ts=NOW - timedelta(seconds=ago),
                    resolution_s=0,
                    interval_s=10.0,
                    process=process,
                    model=model,
                    version=version,
                    slot="blue" if version == "1" else "green",
                    successes=requests,
                    errors=int(rng.integers(0, 3)),
                    client_errors=int(rng.integers(0, 3)),
                    client_error_kinds={"shape": 1} if rng.random() < 0.3 else None,
                    timeouts=int(rng.integers(0, 2)),
                    rejections=int(rng.integers(0, 2)),
                    latency_hist={str(int(rng.integers(20, 60))): requests},
                    latency_sum_s=0.01 * requests,
                    queue_depth_max=int(rng.integers(0, 100)),
                    batches=requests,
                )  # fmt: skip
            )
    with sessions() as session:
        session.add_all(rows)
        session.commit()
        every = observe_all(session, rules, NOW, engine_ready=lambda: True, max_queue_size=128)
        alone = {r.name: observe(session, r, NOW, engine_ready=lambda: True, max_queue_size=128) for r in rules}
    assert every == alone
    deepest = {
        m: max(r.queue_depth_max for r in rows if r.model == m and r.ts > NOW - timedelta(minutes=5))
        for m in ("mlp", "textcls")
    }
    assert every["queue_near_limit"] == {(("model", m),): pytest.approx(depth / 128) for m, depth in deepest.items()}
    assert sum(len(v) for v in every.values()) > 20  # label sets with values, not empty answers
