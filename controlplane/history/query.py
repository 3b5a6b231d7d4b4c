"""Queries over the history: series per metric, summaries, batch-size distributions.

Rows from several processes and several resolutions (raw, 1-minute and 1-hour rollups) add up in
the same way: counters sum, histograms merge, so percentiles over any range come from merged
buckets and never from averaged percentiles.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from alerts.catalogue import METRICS, SLOT_METRICS
from controlplane.models import DeviceSample, SlotSample
from serving import inputstats
from serving.histogram import Histogram

_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}


def _add_counts(into: dict, counts: dict) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


@dataclass
class SlotAggregate:
    """Everything the slot metrics need, added up over rows."""

    successes: int = 0
    errors: int = 0
    client_errors: int = 0
    client_error_kinds: dict[str, int] = field(default_factory=dict)  # kind -> count (see SlotSample)
    timeouts: int = 0
    rejections: int = 0
    latency: Histogram = field(default_factory=Histogram)
    latency_sum_s: float = 0.0
    queue_max: int = 0
    queue_area: float = 0.0  # mean depth x seconds, summed over processes
    batches: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)
    real_tokens: int = 0
    padded_tokens: int = 0
    shadow_compared: int = 0
    shadow_agreed: int = 0
    # Batch compute time per batch size (the judge compares slots at matching sizes), and predicted
    # labels per output (label -> count; bounded per version by the engine: top labels plus 'other').
    compute: dict[int, Histogram] = field(default_factory=dict)
    labels: dict[str, dict[str, int]] = field(default_factory=dict)
    # Sampled numeric inputs per feature: {n, sum, sumsq, bins} (serving.inputstats; merged by adding).
    inputs: dict[str, dict] = field(default_factory=dict)

    # The columns `add` reads: a query that only adds rows up selects these (`columns()`), not whole ORM rows.
    COLUMNS = (
        "successes", "errors", "client_errors", "client_error_kinds", "timeouts", "rejections", "latency_hist",
        "latency_sum_s", "queue_depth_max", "queue_depth_mean", "interval_s", "batches", "batch_sizes",
        "real_tokens", "padded_tokens", "shadow_compared", "shadow_agreed", "compute_hist", "label_counts",
        "input_summaries",
    )  # fmt: skip

    # What `value` needs (every slot metric): all but the compute histograms and the answers, the largest JSON.
    FIGURES = tuple(name for name in COLUMNS if name not in ("compute_hist", "label_counts", "input_summaries"))

    @classmethod
    def columns(cls, figures_only: bool = False) -> tuple[Any, ...]:
        """The SlotSample columns `add` (or `add_figures`) reads, to select instead of whole ORM rows."""
        return tuple(getattr(SlotSample, name) for name in (cls.FIGURES if figures_only else cls.COLUMNS))

    def add(self, row: SlotSample | Row[Any]) -> None:
        """Add one history row (an ORM object, or a row of `COLUMNS`)."""
        self.add_figures(row)
        for size, counts in (row.compute_hist or {}).items():
            self.compute.setdefault(int(size), Histogram()).merge(Histogram.from_dict(counts))
        self.add_answers(row)

    def add_figures(self, row: SlotSample | Row[Any]) -> None:
        """Add what every slot metric (`value`) needs of one row (a row of `FIGURES` will do)."""
        self.successes += row.successes
        self.errors += row.errors
        self.client_errors += row.client_errors or 0
        kinds = dict(row.client_error_kinds or {})
        unnamed = (row.client_errors or 0) - sum(kinds.values())
        if unnamed > 0:  # a row from before kinds were kept: its client errors were the runtime's
            kinds["runtime"] = kinds.get("runtime", 0) + unnamed
        for kind, count in kinds.items():
            self.client_error_kinds[kind] = self.client_error_kinds.get(kind, 0) + count
        self.timeouts += row.timeouts
        self.rejections += row.rejections
        self.latency.merge(Histogram.from_dict(row.latency_hist))
        self.latency_sum_s += row.latency_sum_s
        self.queue_max = max(self.queue_max, row.queue_depth_max)
        self.queue_area += row.queue_depth_mean * row.interval_s
        self.batches += row.batches
        for size, count in row.batch_sizes.items():
            self.batch_sizes[int(size)] = self.batch_sizes.get(int(size), 0) + count
        self.real_tokens += row.real_tokens
        self.padded_tokens += row.padded_tokens
        self.shadow_compared += row.shadow_compared or 0
        self.shadow_agreed += row.shadow_agreed or 0

    def add_answers(self, row: SlotSample | Row[Any]) -> None:
        """Add one row's predicted labels and sampled inputs alone: all that drift compares."""
        for output, counts in (row.label_counts or {}).items():
            _add_counts(self.labels.setdefault(output, {}), counts)
        if row.input_summaries:
            inputstats.merge(self.inputs, row.input_summaries)

    def merge(self, other: SlotAggregate) -> None:
        """Add another aggregate into this one, as if its rows had been added here (nothing of `other` is shared)."""
        self.successes += other.successes
        self.errors += other.errors
        self.client_errors += other.client_errors
        _add_counts(self.client_error_kinds, other.client_error_kinds)
        self.timeouts += other.timeouts
        self.rejections += other.rejections
        self.latency.merge(other.latency)
        self.latency_sum_s += other.latency_sum_s
        self.queue_max = max(self.queue_max, other.queue_max)
        self.queue_area += other.queue_area
        self.batches += other.batches
        _add_counts(self.batch_sizes, other.batch_sizes)
        self.real_tokens += other.real_tokens
        self.padded_tokens += other.padded_tokens
        self.shadow_compared += other.shadow_compared
        self.shadow_agreed += other.shadow_agreed
        for size, histogram in other.compute.items():
            self.compute.setdefault(size, Histogram()).merge(histogram)
        for output, counts in other.labels.items():
            _add_counts(self.labels.setdefault(output, {}), counts)
        inputstats.merge(self.inputs, other.inputs)

    @property
    def requests(self) -> int:
        return self.successes + self.errors + self.client_errors + self.timeouts + self.rejections

    def client_error_share(self, kind: str) -> float | None:
        """The share of all requests refused for their own input in this way; None without requests."""
        requests = self.requests
        return self.client_error_kinds.get(kind, 0) / requests if requests else None

    def value(self, metric: str, seconds: float) -> float | None:
        """Return one metric over an aggregate covering `seconds`; None where undefined."""
        requests = self.requests
        ran = self.successes + self.errors + self.client_errors
        if metric == "requests":
            return float(requests)
        if metric == "throughput":
            return ran / seconds if seconds > 0 else None
        parts = {
            "error_rate": self.errors,
            "client_error_rate": self.client_errors,
            "timeout_rate": self.timeouts,
            "rejection_rate": self.rejections,
        }
        if metric in parts:
            return parts[metric] / requests if requests else None
        if metric in _QUANTILES:
            q = self.latency.quantile(_QUANTILES[metric])
            return None if q is None else q * 1000
        if metric == "latency_mean":
            return self.latency_sum_s / ran * 1000 if ran else None
        if metric == "queue_depth_max":
            return float(self.queue_max)
        if metric == "queue_depth_mean":
            return self.queue_area / seconds if seconds > 0 else None
        if metric == "batch_size_mean":
            total = sum(size * count for size, count in self.batch_sizes.items())
            return total / self.batches if self.batches else None
        if metric == "shadow_agreement":
            return self.shadow_agreed / self.shadow_compared if self.shadow_compared else None
        if metric == "padding_waste":
            return (self.padded_tokens - self.real_tokens) / self.padded_tokens if self.padded_tokens else None
        raise KeyError(metric)


def _slot_rows(
    session: Session, start: datetime, end: datetime, model: str | None, version: str | None, slot: str | None
) -> Iterable[SlotSample]:
    query = select(SlotSample).where(SlotSample.ts > start, SlotSample.ts <= end)
    for column, value in ((SlotSample.model, model), (SlotSample.version, version), (SlotSample.slot, slot)):
        if value is not None:
            query = query.where(column == value)
    return session.scalars(query.order_by(SlotSample.ts))


def _device_value(metric: str, rows: list[DeviceSample]) -> float | None:
    attribute = {
        "gpu_utilization": "utilization",
        "gpu_memory_used": "memory_used_bytes",
        "gpu_memory_total": "memory_total_bytes",
        "fragmentation": "fragmentation",
        "heap_reserved": "reserved_bytes",
        "rss": "memory_used_bytes",
    }[metric]
    values = [getattr(r, attribute) for r in rows if getattr(r, attribute) is not None]
    return sum(values) / len(values) if values else None


def series(
    session: Session,
    metric: str,
    start: datetime,
    end: datetime,
    step_s: int,
    model: str | None = None,
    version: str | None = None,
    slot: str | None = None,
) -> list[dict]:
    """Return one series per model/version/slot (or device) with a point at the end of every step."""
    if metric not in METRICS:
        raise KeyError(metric)
    steps = max(1, math.ceil((end - start).total_seconds() / step_s))

    def index(ts: datetime) -> int:
        return min(steps - 1, int((ts - start).total_seconds() // step_s))

    times = [(start + timedelta(seconds=step_s * (i + 1))).isoformat() for i in range(steps)]
    if metric in SLOT_METRICS:
        groups: dict[tuple[str, str, str], dict[int, SlotAggregate]] = defaultdict(dict)
        for row in _slot_rows(session, start, end, model, version, slot):
            buckets = groups[(row.model, row.version, row.slot)]
            buckets.setdefault(index(row.ts), SlotAggregate()).add(row)
        result = []
        for (m, v, s), buckets in sorted(groups.items()):
            points = [[t, buckets[i].value(metric, step_s) if i in buckets else None] for i, t in enumerate(times)]
            result.append({"labels": {"model": m, "version": v, "slot": s}, "points": points})
        return result
    wanted_cpu = metric in ("fragmentation", "heap_reserved", "rss")
    query = select(DeviceSample).where(DeviceSample.ts > start, DeviceSample.ts <= end)
    query = query.where(DeviceSample.device == "cpu") if wanted_cpu else query.where(DeviceSample.device != "cpu")
    device_groups: dict[str, dict[int, list[DeviceSample]]] = defaultdict(lambda: defaultdict(list))
    for row in session.scalars(query.order_by(DeviceSample.ts)):
        device_groups[row.device][index(row.ts)].append(row)
    return [
        {
            "labels": {"device": device},
            "points": [[t, _device_value(metric, buckets[i]) if i in buckets else None] for i, t in enumerate(times)],
        }
        for device, buckets in sorted(device_groups.items())
    ]


def summary(session: Session, start: datetime, end: datetime, model: str | None = None) -> list[dict]:
    """Return one line of key figures per model/version/slot over the whole range."""
    groups: dict[tuple[str, str, str], SlotAggregate] = defaultdict(SlotAggregate)
    for row in _slot_rows(session, start, end, model, None, None):
        groups[(row.model, row.version, row.slot)].add(row)
    seconds = (end - start).total_seconds()
    names = (
        "requests",
        "throughput",
        "error_rate",
        "client_error_rate",
        "timeout_rate",
        "rejection_rate",
        "p50",
        "p99",
        "padding_waste",
    )
    return [
        {"model": m, "version": v, "slot": s, **{name: agg.value(name, seconds) for name in names}}
        for (m, v, s), agg in sorted(groups.items())
    ]


def batch_distribution(session: Session, start: datetime, end: datetime, model: str | None = None) -> list[dict]:
    """Return how many batches of each size every model/version/slot ran in the range."""
    groups: dict[tuple[str, str, str], SlotAggregate] = defaultdict(SlotAggregate)
    for row in _slot_rows(session, start, end, model, None, None):
        groups[(row.model, row.version, row.slot)].add(row)
    return [
        {
            "labels": {"model": m, "version": v, "slot": s},
            "counts": {str(k): c for k, c in sorted(agg.batch_sizes.items())},
        }
        for (m, v, s), agg in sorted(groups.items())
    ]
