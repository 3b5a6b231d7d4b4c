"""Retention: raw rows roll up into 1-minute rows, those into 1-hour rows, and the oldest go.

Rolling up merges histograms and sums counters, so a percentile over a rolled-up range is as
correct as over the raw rows it replaced. Each rollup writes its rows and deletes the ones it
replaced in one transaction, so no query ever counts a request twice or misses it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controlplane.history.query import SlotAggregate
from controlplane.models import DeviceSample, SlotSample

log = logging.getLogger(__name__)

RAW, MINUTE, HOUR = 0, 60, 3600


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each resolution is kept."""

    raw: timedelta = timedelta(hours=6)
    minute: timedelta = timedelta(days=7)
    hour: timedelta = timedelta(days=90)


def _bucket_end(ts: datetime, seconds: int) -> datetime:
    epoch = ts.timestamp()
    end = -(-epoch // seconds) * seconds  # ceiling: a row ending exactly on the boundary stays in it
    return datetime.fromtimestamp(end, UTC)


def _roll_up_slots(session: Session, source: int, target: int, cutoff: datetime) -> int:
    rows = list(session.scalars(select(SlotSample).where(SlotSample.resolution_s == source, SlotSample.ts <= cutoff)))
    groups: dict[tuple[datetime, str, str, str], list[SlotSample]] = defaultdict(list)
    for row in rows:
        end = _bucket_end(row.ts, target)
        if end <= cutoff:  # only whole buckets, so a bucket is never split between resolutions
            groups[(end, row.model, row.version, row.slot)].append(row)
    for (end, model, version, slot), members in groups.items():
        agg = SlotAggregate()
        for row in members:
            agg.add(row)
        session.add(
            SlotSample(
                ts=end,
                resolution_s=target,
                interval_s=float(target),
                process="*",
                model=model,
                version=version,
                slot=slot,
                successes=agg.successes,
                errors=agg.errors,
                client_errors=agg.client_errors,
                client_error_kinds=dict(sorted(agg.client_error_kinds.items())),
                timeouts=agg.timeouts,
                rejections=agg.rejections,
                latency_hist=agg.latency.to_dict(),
                latency_sum_s=agg.latency_sum_s,
                queue_depth_max=agg.queue_max,
                queue_depth_mean=agg.queue_area / target,
                batches=agg.batches,
                batch_sizes={str(k): v for k, v in sorted(agg.batch_sizes.items())},
                real_tokens=agg.real_tokens,
                padded_tokens=agg.padded_tokens,
                shadow_compared=agg.shadow_compared,
                shadow_agreed=agg.shadow_agreed,
                compute_hist={str(k): h.to_dict() for k, h in sorted(agg.compute.items())} or None,
                label_counts=agg.labels or None,
                input_summaries=agg.inputs or None,
            )
        )
    replaced = [row.id for members in groups.values() for row in members]
    for start in range(0, len(replaced), 500):
        session.execute(delete(SlotSample).where(SlotSample.id.in_(replaced[start : start + 500])))
    return len(replaced)


def _mean(values: list[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _roll_up_devices(session: Session, source: int, target: int, cutoff: datetime) -> int:
    rows = list(
        session.scalars(select(DeviceSample).where(DeviceSample.resolution_s == source, DeviceSample.ts <= cutoff))
    )
    groups: dict[tuple[datetime, str, str], list[DeviceSample]] = defaultdict(list)
    for row in rows:
        end = _bucket_end(row.ts, target)
        if end <= cutoff:
            groups[(end, row.process, row.device)].append(row)
    for (end, process, device), members in groups.items():

        def mean(attribute: str, members: list[DeviceSample] = members) -> float | None:
            return _mean([getattr(m, attribute) for m in members])

        def whole(attribute: str) -> int | None:
            value = mean(attribute)
            return None if value is None else int(value)

        session.add(
            DeviceSample(
                ts=end,
                resolution_s=target,
                interval_s=float(target),
                process=process,
                device=device,
                name=members[-1].name,
                utilization=mean("utilization"),
                memory_used_bytes=whole("memory_used_bytes"),
                memory_total_bytes=whole("memory_total_bytes"),
                reserved_bytes=whole("reserved_bytes"),
                in_use_bytes=whole("in_use_bytes"),
                fragmentation=mean("fragmentation"),
            )
        )
    replaced = [row.id for members in groups.values() for row in members]
    for start in range(0, len(replaced), 500):
        session.execute(delete(DeviceSample).where(DeviceSample.id.in_(replaced[start : start + 500])))
    return len(replaced)


def apply_retention(session: Session, now: datetime, policy: RetentionPolicy) -> dict[str, int]:
    """Roll up and delete by age; commits once per step. Return how many rows each step touched."""
    done = {}
    for name, source, target, keep in (("raw", RAW, MINUTE, policy.raw), ("minute", MINUTE, HOUR, policy.minute)):
        with session.begin():
            done[f"{name}_rolled_up"] = _roll_up_slots(session, source, target, now - keep) + _roll_up_devices(
                session, source, target, now - keep
            )
    with session.begin():
        cutoff = now - policy.hour
        expired = (
            session.execute(delete(SlotSample).where(SlotSample.resolution_s == HOUR, SlotSample.ts <= cutoff)).rowcount
            + session.execute(
                delete(DeviceSample).where(DeviceSample.resolution_s == HOUR, DeviceSample.ts <= cutoff)
            ).rowcount
        )
    done["hour_deleted"] = expired
    if any(done.values()):
        log.info("history retention: %s", done)
    return done
