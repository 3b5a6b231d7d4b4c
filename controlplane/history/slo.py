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
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, case, cast, func, literal, select, true
from sqlalchemy.orm import Session

from alerts.rules import Insufficient, duration_text, too_little_traffic
from alerts.slo import ALERT_WINDOWS, SLI, SLO, WINDOWS, BurnRule, budget_remaining, burn_rate, rule_name
from controlplane.models import SlotSample
from serving.histogram import GROWTH, bucket_of, lower_edge

Key = tuple[tuple[str, str], ...]
HOUR = timedelta(hours=1)


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


# What one span of the history holds for an SLI: (good, total) requests for availability; for latency the
# latency histogram's counts per bucket (the threshold is applied when a window is counted).
Sums = tuple[int, int] | dict[str, int]
Span = tuple[datetime, datetime]  # (start, end]


RUN_SPANS = 24  # at most this many spans per query: each row's span is found by a CASE over their ends


def _runs(spans: Sequence[Span]) -> list[list[int]]:
    """The indexes of `spans` (disjoint) in time order, in runs of up to RUN_SPANS that follow on without a gap."""
    runs: list[list[int]] = []
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        if runs and spans[runs[-1][-1]][1] == spans[i][0] and len(runs[-1]) < RUN_SPANS:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _read(session: Session, sli: SLI, model: str, spans: Sequence[Span]) -> list[Sums]:
    """What the model's rows in each of `spans` (disjoint) add up to; the database does the adding up.

    One query per run of adjacent spans, on the (model, ts) index, each row's span told apart by its time.
    For latency the database adds up the stored JSON histograms per bucket (json_each): parsing 30 days
    of them in Python took ~0.5 s per SLO, and only the buckets' sums come back.
    """
    # NOTE: not one query for every span: a CASE per span and an OR of their ranges took SQLite ~10 µs a row.
    found: list[Sums] = [{} if sli is SLI.LATENCY else (0, 0) for _ in spans]
    for run in _runs(spans):
        which = (
            case(*[(SlotSample.ts <= spans[i][1], i) for i in run[:-1]], else_=run[-1]) if run[1:] else literal(run[0])
        )
        where = (SlotSample.model == model, SlotSample.ts > spans[run[0]][0], SlotSample.ts <= spans[run[-1]][1])
        if sli is SLI.LATENCY:
            if session.get_bind().dialect.name == "postgresql":
                buckets = func.json_each_text(SlotSample.latency_hist).table_valued("key", "value")
            else:  # SQLite's JSON1, built into every supported Python
                buckets = func.json_each(SlotSample.latency_hist).table_valued("key", "value")
            query = (
                select(which, buckets.c.key, func.sum(cast(buckets.c.value, Integer)))
                .join_from(SlotSample, buckets, true())
                .where(*where)
                .group_by(which, buckets.c.key)
            )
            for i, index, count in session.execute(query):
                found[i][str(index)] = int(count)  # type: ignore[index]
        else:
            good = SlotSample.successes + func.coalesce(SlotSample.client_errors, 0)
            total = good + SlotSample.errors + SlotSample.timeouts + SlotSample.rejections
            for i, good_sum, total_sum in session.execute(
                select(which, func.sum(good), func.sum(total)).where(*where).group_by(which)
            ):
                found[i] = (int(good_sum or 0), int(total_sum or 0))
    return found


def _add(parts: Sequence[Sums], sli: SLI) -> Sums:
    if sli is SLI.LATENCY:
        merged: dict[str, int] = {}
        for histogram in parts:
            for index, count in histogram.items():  # type: ignore[union-attr]
                merged[index] = merged.get(index, 0) + count
        return merged
    return (sum(p[0] for p in parts), sum(p[1] for p in parts))  # type: ignore[index]


def _judge(sums: Sums, slo: SLO) -> tuple[float, int]:
    """(good, total) requests of `sums` as the SLO counts them."""
    if slo.sli is SLI.LATENCY:
        return _under(sums, (slo.threshold_ms or 0.0) / 1000)  # type: ignore[arg-type]
    return float(sums[0]), int(sums[1])  # type: ignore[index]


def _floor_hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


class ClosedHours:
    """The sums of whole past hours of the history, per model and SLI, kept between evaluations.

    A window of days is then read from the database only at its ragged ends (its first partial hour and
    the last `OPEN_FOR`), not row by row every evaluation: without this, each alert evaluation re-read
    every row of the 1-day and 3-day burn windows, and an idle server's CPU grew with its history.

    NOTE: an hour that ended `OPEN_FOR` ago no longer changes: rows are written at their interval's end,
    and retention's rollups keep every row in its hour (a 1-minute or 1-hour row ends where its bucket
    ends, on the hour or inside it). An hour is read again `TTL_S` after it was read anyway, so a late
    row (a node whose clock is behind, a restored database) counts within that time. Safe across threads.

    It also keeps, for the latest `now` only, each SLO's counts over every alert window: the four burn
    rules of an SLO, evaluated at one `now`, then read the open hours once between them.
    """

    OPEN_FOR = timedelta(minutes=10)
    TTL_S = 3600.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._hours: dict[tuple[SLI, str, datetime], tuple[float, Sums]] = {}
        self._latest: dict[str, tuple[datetime, SLO, dict[timedelta, Counts]]] = {}  # by SLO name
        self._first: dict[str, tuple[float, datetime]] = {}  # by model: when kept, the first row's time

    def alert_windows(self, session: Session, slo: SLO, now: datetime) -> dict[timedelta, Counts]:
        """The SLO's counts over every alert window ending at `now` (counted once per `now`)."""
        with self._lock:
            at, kept, counts = self._latest.get(slo.name, (None, None, {}))
        if at != now or kept != slo:
            counts = dict(zip(ALERT_WINDOWS, window_counts(session, slo, now, ALERT_WINDOWS, self), strict=True))
            with self._lock:
                self._latest = {k: v for k, v in self._latest.items() if v[0] == now}
                self._latest[slo.name] = (now, slo, counts)
        return counts

    def first_row(self, session: Session, model: str) -> datetime | None:
        """When the model's first row ends, kept for `TTL_S` (a model's SLOs share it).

        NOTE: the first row only moves later (retention), and a kept time earlier than the true one only
        costs reads of empty rings; a late row older than it counts within `TTL_S`, as a late row in a
        kept hour does. No first row is not kept: the model's first rows must count at once.
        """
        with self._lock:
            entry = self._first.get(model)
        if entry is not None and self._clock() - entry[0] < self.TTL_S:
            return entry[1]
        first = _first_row(session, model)
        if first is not None:
            with self._lock:
                self._first[model] = (self._clock(), first)
        return first

    def closed_until(self, now: datetime) -> datetime:
        """The end of the last hour that can no longer change."""
        return _floor_hour(now - self.OPEN_FOR)

    def get(self, sli: SLI, model: str, hour_end: datetime) -> Sums | None:
        """The kept sums of the hour ending at `hour_end`, or None when not kept (or kept too long)."""
        with self._lock:
            entry = self._hours.get((sli, model, hour_end))
        if entry is None or self._clock() - entry[0] >= self.TTL_S:
            return None
        return entry[1]

    def keep(self, sli: SLI, model: str, hours: dict[datetime, Sums]) -> None:
        """Keep the sums of these hours (by their end), and forget those kept too long."""
        now = self._clock()
        with self._lock:
            for key in [k for k, (at, _) in self._hours.items() if now - at >= self.TTL_S]:
                del self._hours[key]
            for hour_end, sums in hours.items():
                self._hours[(sli, model, hour_end)] = (now, sums)


def _first_row(session: Session, model: str) -> datetime | None:
    return session.scalar(select(func.min(SlotSample.ts)).where(SlotSample.model == model))


def _hour_ends(start: datetime, end: datetime) -> list[datetime]:
    """The ends of the whole hours that make up (start, end], both on the hour."""
    return [start + (k + 1) * HOUR for k in range(round((end - start) / HOUR))]


def window_counts(
    session: Session, slo: SLO, now: datetime, windows: Sequence[timedelta], closed: ClosedHours | None = None
) -> list[Counts]:
    """Count good and total requests in each window ending at `now`; the database does the adding up.

    With `closed`, whole hours that can no longer change come from it (and go into it once read).
    """
    starts = sorted({now - w for w in windows})  # earliest first
    # NOTE: rows are summed per ring (between two window starts) and a window is the sum of the rings
    # after its start, so no row is read twice and no timestamp or JSON is parsed here. With `closed`, the
    # rings are also cut on the hours around each start, and a ring of whole closed hours is their sum.
    points = {*starts, now}
    cut = closed.closed_until(now) if closed is not None else None
    if cut is not None and starts[0] < cut:
        points |= {cut} | {h for s in starts if s < cut for h in (_floor_hour(s), _floor_hour(s) + HOUR)}
    edges = sorted(p for p in points if p >= starts[0])
    rings = list(zip(edges, edges[1:], strict=False))
    whole = {
        ring: _hour_ends(*ring)
        for ring in rings
        if cut is not None and ring[1] <= cut and _floor_hour(ring[0]) == ring[0] and _floor_hour(ring[1]) == ring[1]
    }
    hours = {end: closed.get(slo.sli, slo.model, end) for ends in whole.values() for end in ends}  # type: ignore[union-attr]
    missing = [end for end, sums in hours.items() if sums is None]
    partial = [ring for ring in rings if ring not in whole]
    # NOTE: what ended before the model's first row holds nothing: an hour is kept empty, a ring not read (on a
    # young server most of the 1-day and 3-day windows' rings).
    first = closed.first_row(session, slo.model) if closed is not None else _first_row(session, slo.model)
    nothing = _add([], slo.sli)
    if missing:
        empty = dict.fromkeys([end for end in missing if first is None or end < first], nothing)
        closed.keep(slo.sli, slo.model, empty)  # type: ignore[union-attr]
        hours.update(empty)
        missing = [end for end in missing if end not in empty]
    unread = {ring: nothing for ring in partial if first is None or ring[1] < first}
    partial = [ring for ring in partial if ring not in unread]
    read = _read(session, slo.sli, slo.model, [*partial, *[(end - HOUR, end) for end in missing]])
    if missing:
        hours.update(zip(missing, read[len(partial) :], strict=True))
        closed.keep(slo.sli, slo.model, {end: hours[end] for end in missing})  # type: ignore[union-attr,misc]
    sums = {
        **unread,
        **dict(zip(partial, read, strict=False)),
        **{r: _add([hours[e] for e in ends], slo.sli) for r, ends in whole.items()},
    }  # type: ignore[misc]
    judged = [(ring[0], _judge(sums[ring], slo)) for ring in rings]
    counts = []
    for w in windows:
        after = [c for start, c in judged if start >= now - w]
        counts.append(Counts(good=round(sum(g for g, _ in after)), total=sum(t for _, t in after)))
    return counts


def burn_observation(
    session: Session, rule: BurnRule, now: datetime, closed: ClosedHours | None = None
) -> dict[Key, float | Insufficient]:
    """A generated SLO rule's value: the lower burn rate of its two windows, so it holds when both are above."""
    slo = rule.slo
    assert slo is not None, "a BurnRule is made by alerts.slo.burn_rules, with its SLO"
    windows = (rule.condition.window, rule.short_window)
    if closed is not None and set(windows) <= set(ALERT_WINDOWS):
        every = closed.alert_windows(session, slo, now)
        counts = [every[w] for w in windows]
    else:
        counts = window_counts(session, slo, now, windows, closed)
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


def slo_status(session: Session, slo: SLO, now: datetime, closed: ClosedHours | None = None) -> dict[str, Any]:
    """Describe one SLO now: objective, period, good/total, budget left, and the burn rate over each alert window."""
    windows = ALERT_WINDOWS
    whole, *parts = window_counts(session, slo, now, [slo.period, *windows], closed)
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
