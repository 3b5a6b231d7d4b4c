"""Retention: rollups keep every count and merge histograms; the database stops growing."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from controlplane.history import query
from controlplane.history.retention import RetentionPolicy, apply_retention
from controlplane.models import DeviceSample, SlotSample
from tests.controlplane.history.conftest import T0, latencies, slot_row

POLICY = RetentionPolicy(raw=timedelta(hours=1), minute=timedelta(hours=6), hour=timedelta(hours=24))


def device_row(ts, fragmentation):
    return DeviceSample(
        ts=ts,
        resolution_s=0,
        interval_s=10.0,
        process="p1",
        device="cpu",
        name="heap",
        utilization=None,
        memory_used_bytes=1000,
        memory_total_bytes=None,
        reserved_bytes=800,
        in_use_bytes=600,
        fragmentation=fragmentation,
    )


def test_rollup_preserves_counts_and_percentiles_of_what_it_replaces(sessions) -> None:
    with sessions() as s, s.begin():
        for i in range(6 * 30):  # 30 minutes of 10-second rows from two processes
            ts = T0 + timedelta(seconds=10 * (i // 2 + 1))
            s.add(slot_row(ts, latencies(i, 20), errors=i % 3, client_errors=i % 5, process=f"p{i % 2}"))
            s.add(device_row(ts, 0.1 + (i % 2) * 0.2))
    with sessions() as s:
        before = query.summary(s, T0, T0 + timedelta(hours=1))
        frag_before = query.series(s, "fragmentation", T0, T0 + timedelta(minutes=30), 1800)[0]["points"][0][1]
    with sessions() as s:
        done = apply_retention(s, T0 + timedelta(hours=2), POLICY)
    assert done["raw_rolled_up"] == 360
    with sessions() as s:
        resolutions = dict(
            s.execute(select(SlotSample.resolution_s, func.count()).group_by(SlotSample.resolution_s)).all()
        )
        after = query.summary(s, T0, T0 + timedelta(hours=1))
        frag_after = query.series(s, "fragmentation", T0, T0 + timedelta(minutes=30), 1800)[0]["points"][0][1]
    assert resolutions == {60: 15}  # 15 one-minute rows, processes merged
    assert after == before  # same requests, errors and (merged-bucket) percentiles
    assert after[0]["client_error_rate"] == before[0]["client_error_rate"] > 0
    assert abs(frag_after - frag_before) < 1e-9


def test_only_whole_buckets_older_than_the_cutoff_roll_up(sessions) -> None:
    with sessions() as s, s.begin():
        for i in range(12):  # 12:00:10 .. 12:02:00
            s.add(slot_row(T0 + timedelta(seconds=10 * (i + 1)), latencies(i, 5)))
    with sessions() as s:
        apply_retention(s, T0 + timedelta(hours=1, seconds=90), POLICY)  # cutoff 12:01:30
    with sessions() as s:
        rows = sorted((r.resolution_s, r.ts) for r in s.scalars(select(SlotSample)))
    assert [r for r in rows if r[0] == 60] == [(60, T0 + timedelta(minutes=1))]
    assert [r for r in rows if r[0] == 0] == [(0, T0 + timedelta(seconds=10 * (i + 1))) for i in range(6, 12)]


def test_two_simulated_days_keep_the_table_and_file_bounded(sessions, tmp_path) -> None:
    rows_seen = []
    sizes = []
    for tick in range(0, 48 * 6):  # every simulated 10 minutes for 48 hours
        now = T0 + timedelta(minutes=10 * (tick + 1))
        with sessions() as s, s.begin():
            for j in range(60):  # ten minutes of raw rows, 10 s apart
                s.add(slot_row(now - timedelta(seconds=600 - 10 * (j + 1)), latencies(j, 3)))
        with sessions() as s:
            apply_retention(s, now, POLICY)
            rows_seen.append(s.scalar(select(func.count()).select_from(SlotSample)))
        if tick % 36 == 35:
            sizes.append((tmp_path / "flightdeck.db").stat().st_size)  # the `sessions` fixture's file
    # raw: 1 h = 360 rows (+ up to one unrolled minute); minute: 6 h = 360; hour: 24 h = 24.
    assert max(rows_seen) <= 360 + 6 + 360 + 24 + 1
    assert rows_seen[-1] >= 360 + 300  # and it is really keeping the recent history
    assert sizes[-1] <= sizes[len(sizes) // 2] * 1.1  # the file stops growing once retention is steady
    with sessions() as s:
        oldest = s.scalar(select(func.min(SlotSample.ts)))
    assert oldest >= T0 + timedelta(hours=48 - 24 - 1)
