"""The sampler: every interval, one row per loaded model/version/slot of this process, and per device.

Each process samples its own engine (several gunicorn workers each write their own rows); queries
add them up. Counters are cumulative in the engine, so a row holds the difference between two
snapshots of the same loaded version.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from controlplane.clock import utcnow
from controlplane.models import DeviceSample, SlotSample
from serving import inputstats
from serving.batching import BatcherSnapshot
from serving.engine import Engine, LoadedVersion
from serving.memory import heap_stats
from serving.telemetry import sample_gpus

log = logging.getLogger(__name__)


def slot_row(
    loaded: LoadedVersion,
    before: BatcherSnapshot,
    after: BatcherSnapshot,
    ts: datetime,
    process: str,
    shadow: tuple[int, int] = (0, 0),
) -> SlotSample:
    """Build the row for what one loaded version did between two snapshots."""
    batches = {
        str(size): count - before.batch_counts.get(size, 0)
        for size, count in sorted(after.batch_counts.items())
        if count - before.batch_counts.get(size, 0)
    }
    return SlotSample(
        ts=ts,
        resolution_s=0,
        interval_s=after.taken_at - before.taken_at,
        process=process,
        model=loaded.spec.name,
        version=loaded.spec.version,
        slot=loaded.slot,
        successes=after.success - before.success,
        # Triton's `failed` counts both; the history keeps server and client errors apart.
        errors=(after.failed - after.client_errors) - (before.failed - before.client_errors),
        client_errors=after.client_errors - before.client_errors,
        client_error_kinds={
            kind: count - before.client_error_kinds.get(kind, 0)
            for kind, count in sorted(after.client_error_kinds.items())
            if count - before.client_error_kinds.get(kind, 0)
        },
        timeouts=after.timeouts - before.timeouts,
        rejections=after.rejected - before.rejected,
        latency_hist=after.latency.minus(before.latency).to_dict(),
        latency_sum_s=after.latency_sum_s - before.latency_sum_s,
        queue_depth_max=after.queue_depth_max,
        queue_depth_mean=after.queue_depth_mean,
        batches=after.execution_count - before.execution_count,
        batch_sizes=batches,
        real_tokens=after.real_tokens - before.real_tokens,
        padded_tokens=after.padded_tokens - before.padded_tokens,
        shadow_compared=shadow[0],
        shadow_agreed=shadow[1],
        compute_hist=_compute_since(before, after) or None,
        label_counts=_labels_since(before, after) or None,
        input_summaries=inputstats.since(before.inputs, after.inputs) or None,
    )


def _compute_since(before: BatcherSnapshot, after: BatcherSnapshot) -> dict[str, dict[str, int]]:
    """Batch compute-time histograms per batch size added between two snapshots."""
    found = {}
    for size, hist in sorted(after.compute.items()):
        added = hist.minus(before.compute[size]) if size in before.compute else hist
        if added.total:
            found[str(size)] = added.to_dict()
    return found


def _labels_since(before: BatcherSnapshot, after: BatcherSnapshot) -> dict[str, dict[str, int]]:
    """Predicted-label counts per output added between two snapshots."""
    found = {}
    for output, counts in after.labels.items():
        earlier = before.labels.get(output, {})
        added = {label: n - earlier.get(label, 0) for label, n in counts.items() if n - earlier.get(label, 0)}
        if added:
            found[output] = added
    return found


def device_rows(ts: datetime, interval_s: float, process: str) -> list[DeviceSample]:
    """Read this process's heap and every visible GPU."""
    rows = []
    heap = heap_stats()
    if heap is not None:
        rows.append(
            DeviceSample(
                ts=ts,
                resolution_s=0,
                interval_s=interval_s,
                process=process,
                device="cpu",
                name="process heap",
                utilization=None,
                memory_used_bytes=heap.rss_bytes,
                memory_total_bytes=None,
                reserved_bytes=heap.reserved_bytes,
                in_use_bytes=heap.in_use_bytes,
                fragmentation=heap.fragmentation,
            )
        )
    for gpu in sample_gpus():
        rows.append(
            DeviceSample(
                ts=ts,
                resolution_s=0,
                interval_s=interval_s,
                process=process,
                device=f"gpu{gpu.index}",
                name=gpu.name,
                utilization=gpu.utilization,
                memory_used_bytes=gpu.memory_used_bytes,
                memory_total_bytes=gpu.memory_total_bytes,
                reserved_bytes=None,
                in_use_bytes=None,
                fragmentation=None,
            )
        )
    return rows


class HistorySampler:
    """Turn engine snapshots into history rows; `sample()` is the scheduled job."""

    def __init__(
        self,
        engine: Engine,
        sessions: sessionmaker[Session],
        process: str,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._engine = engine
        self._sessions = sessions
        self._process = process
        self._clock = clock
        # Keyed by the loaded object itself: a reload into the same slot is a new series from zero.
        self._previous: dict[int, tuple[LoadedVersion, BatcherSnapshot, tuple[int, int]]] = {}
        # NOTE: the scheduler samples every interval and the reconciler at once after it moved traffic
        # (so a rollout step's rows begin when its weights took effect): one at a time.
        self._lock = threading.Lock()

    def collect(self) -> list[SlotSample | DeviceSample]:
        """Snapshot every loaded version and return the rows for the interval just ended.

        A version unloaded since the last call still gets its final row (its counters outlive it),
        and a version loaded since then counts from its load, so a rollout loses no request.
        """
        ts = self._clock()
        current = {id(v): v for v in self._engine.loaded()}
        retired = {key: entry[0] for key, entry in self._previous.items() if key not in current}
        rows: list[SlotSample | DeviceSample] = []
        kept = {}
        longest = 0.0
        for key, loaded in {**current, **retired}.items():
            if key in self._previous:
                _, before, shadow_before = self._previous[key]
            else:
                before, shadow_before = loaded.batcher.zero_snapshot(), (0, 0)
            after, shadow_after = loaded.batcher.snapshot(), (loaded.shadow.compared, loaded.shadow.agreed)
            shadow = (shadow_after[0] - shadow_before[0], shadow_after[1] - shadow_before[1])
            row = slot_row(loaded, before, after, ts, self._process, shadow)
            rows.append(row)
            longest = max(longest, row.interval_s)
            if key in current:
                kept[key] = (loaded, after, shadow_after)
        self._previous = kept
        rows.extend(device_rows(ts, longest, self._process))
        return rows

    def sample(self) -> int:
        """Collect and store one interval's rows; return how many were written."""
        with self._lock:
            rows = self.collect()
            with self._sessions() as session, session.begin():
                session.add_all(rows)
        return len(rows)
