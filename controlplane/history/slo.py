"""SLOs over the history: good and total requests per window, the error budget left, the burn rates.

Rows from every process, version, slot and resolution of the SLO's model add up, as everywhere in
the history. Availability counts whole requests: bad are server errors, timeouts and queue-full
refusals; a client error (a 400 for the request's own input, `serving.faults`) is a good answer. Latency
counts the requests that ran (the latency histogram's), good when they finished within the
threshold; the share of the one histogram bucket holding the threshold is interpolated on a log
scale, as the percentiles are, so a count is exact to within that bucket (about 9% wide).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, Select, case, cast, func, select, true
from sqlalchemy.orm import Session

from alerts.rules import Insufficient, duration_text, too_little_traffic
from alerts.slo import ALERT_WINDOWS, SLI, SLO, WINDOWS, BurnRule, budget_remaining, burn_rate, rule_name
from controlplane.models import SlotSample
from serving.histogram import GROWTH, bucket_of, lower_edge

Key = tuple[tuple[str, str], ...]


@dataclass
class Counts:
    """Requests an SLO judged in a window, and how many of them were good."""

    good: int = 0
    total: int = 0

    @property
    def bad(self) -> int:
        return self.total - self.good


def _under(histogram: dict[str, int], seconds: float) -> tuple[float, int]:
    """Return (requests within `seconds`, all requests) of one stored histogram."""
    edge = bucket_of(seconds)
    low = lower_edge(edge)
    # The threshold's own bucket counts in proportion to where it falls, on a log scale.
    share = math.log(seconds / low) / math.log(GROWTH) if low > 0 else 0.0
    good, total = 0.0, 0
    for index, count in histogram.items():
        i = int(index)
        total += count
        if i < edge:
            good += count
        elif i == edge:
            good += count * min(1.0, share)
    return good, total


def _bucket_sums(session: Session, model: str, start: datetime, end: datetime) -> Select:
    """The model's histogram counts per bucket in (start, end], summed by the database from the stored JSON."""
    # NOTE: parsing 30 days of JSON histograms in Python took ~0.5 s per SLO; the database's own JSON
    # functions add them up several times faster, and only the buckets' sums come back.
    if session.get_bind().dialect.name == "postgresql":
        buckets = func.json_each_text(SlotSample.latency_hist).table_valued("key", "value")
    else:  # SQLite's JSON1, built into every supported Python
        buckets = func.json_each(SlotSample.latency_hist).table_valued("key", "value")
    return (
        select(buckets.c.key, func.sum(cast(buckets.c.value, Integer)))
        .join_from(SlotSample, buckets, true())
        .where(SlotSample.model == model, SlotSample.ts > start, SlotSample.ts <= end)
        .group_by(buckets.c.key)
    )


def window_counts(session: Session, slo: SLO, now: datetime, windows: Sequence[timedelta]) -> list[Counts]:
    """Count good and total requests in each window ending at `now`; the database does the adding up."""
    starts = sorted({now - w for w in windows})  # earliest first
    # NOTE: rows are summed per ring (between two window starts) and a window is the sum of the rings
    # after its start, so no row is read twice and no timestamp or JSON is parsed here.
    rings = [(0.0, 0)] * len(starts)
    if slo.sli is SLI.LATENCY:
        # One grouped query per ring: cheaper for SQLite than grouping by the ring as well.
        for i, (start, end) in enumerate(zip(starts, [*starts[1:], now], strict=True)):
            merged = {
                str(index): int(count) for index, count in session.execute(_bucket_sums(session, slo.model, start, end))
            }
            rings[i] = _under(merged, (slo.threshold_ms or 0.0) / 1000)
    else:
        ring = case(*[(SlotSample.ts > start, i) for i, start in reversed(list(enumerate(starts)))], else_=0)
        where = (SlotSample.model == slo.model, SlotSample.ts > starts[0], SlotSample.ts <= now)
        good = SlotSample.successes + func.coalesce(SlotSample.client_errors, 0)
        total = good + SlotSample.errors + SlotSample.timeouts + SlotSample.rejections
        query = select(ring, func.sum(good), func.sum(total)).where(*where).group_by(ring)
        for i, good_sum, total_sum in session.execute(query):
            rings[i] = (float(good_sum or 0), int(total_sum or 0))
    after = {start: rings[i:] for i, start in enumerate(starts)}
    return [
        Counts(good=round(sum(g for g, _ in after[now - w])), total=sum(t for _, t in after[now - w])) for w in windows
    ]


def burn_observation(session: Session, rule: BurnRule, now: datetime) -> dict[Key, float | Insufficient]:
    """A generated SLO rule's value: the lower burn rate of its two windows, so it holds when both are above."""
    slo = rule.slo
    assert slo is not None, "a BurnRule is made by alerts.slo.burn_rules, with its SLO"
    windows = (rule.condition.window, rule.short_window)
    counts = window_counts(session, slo, now, windows)
    key = (("model", slo.model),)
    if counts[0].total == 0:
        return {}  # no traffic at all: no data
    # NOTE: a window with too few requests is no evidence either way: the alert says so rather than judge.
    need = slo.minimum(rule.condition.threshold)
    for window, c in zip(windows, counts, strict=True):
        if c.total < need:
            return {key: too_little_traffic(c.total, need, window)}
    return {key: min(burn_rate(c.bad, c.total, slo) or 0.0 for c in counts)}


def _burning(counts: Counts, slo: SLO, factor: float) -> bool:
    rate = burn_rate(counts.bad, counts.total, slo)
    return counts.total >= slo.minimum(factor) and rate is not None and rate > factor


def slo_status(session: Session, slo: SLO, now: datetime) -> dict[str, Any]:
    """Describe one SLO now: objective, period, good/total, budget left, and the burn rate over each alert window."""
    windows = ALERT_WINDOWS
    whole, *parts = window_counts(session, slo, now, [slo.period, *windows])
    remaining = budget_remaining(whole.bad, whole.total, slo)
    burn = {duration_text(w): burn_rate(c.bad, c.total, slo) for w, c in zip(windows, parts, strict=True)}
    return {
        "name": slo.name,
        "model": slo.model,
        "sli": slo.sli.value,
        "objective_percent": round(slo.objective * 100, 6),
        "threshold_ms": slo.threshold_ms,
        "period": duration_text(slo.period),
        "start": (now - slo.period).isoformat(),
        "end": now.isoformat(),
        "good": whole.good,
        "total": whole.total,
        "budget_remaining_percent": None if remaining is None else remaining * 100,
        "burn_rates": [
            {"window": duration_text(w), "burn_rate": burn[duration_text(w)], "good": c.good, "total": c.total}
            for w, c in zip(windows, parts, strict=True)
        ],
        "alerts": [
            {
                "rule": rule_name(slo, w),
                "severity": w.severity.value,
                "long": duration_text(w.long),
                "short": duration_text(w.short),
                "factor": w.factor(slo.period),
                "burning": all(_burning(parts[windows.index(x)], slo, w.factor(slo.period)) for x in (w.long, w.short)),
            }
            for w in WINDOWS
        ],
        "words": slo.words(),
    }
