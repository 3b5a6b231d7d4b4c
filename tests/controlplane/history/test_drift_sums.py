"""What the leader keeps between drift looks: sums of settled minutes and of an open reference's settled part.

The drift rule (every 15 s) and the drift-score job (every 60 s) scored a version's last hour against its
first day by reading both whole at every look: 160 ms of CPU an hour into a version's life with traffic,
230 ms six hours in (bench.alert_cost). What must hold: a kept sum equals reading the rows, look after
look, as rows keep coming; each look reads only the ragged ends; a row that came late is counted within
`KEPT_FOR`; and merging two aggregates equals adding their rows.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import select

from controlplane.history import drift
from controlplane.history.query import SlotAggregate
from controlplane.models import SlotSample
from serving import inputstats
from serving.histogram import Histogram
from tests.controlplane.history.conftest import T0, latencies, slot_row

STEP = timedelta(seconds=10)


def answered(ts, rng: np.random.Generator, process: str = "p1") -> SlotSample:
    """A row of a classifier that answered: labels, an input's summary, and the latency figures."""
    row = slot_row(
        ts, latencies(int(rng.integers(1 << 30)), 20), process=process, model="mlp", errors=1, client_errors=2,
        queue=(3, 0.5), tokens=(90, 40),
    )  # fmt: skip
    row.client_error_kinds, row.timeouts, row.rejections = {"shape": 2}, 1, 1
    row.label_counts = {"logits": {str(label): int(rng.integers(1, 9)) for label in range(4)}}
    summaries: dict = {}
    inputstats.add_values(summaries, [("input", rng.normal(1, 0.2, 30).tolist())])
    row.input_summaries = summaries
    row.compute_hist = {"1": Histogram({30: 5, 31: 2}).to_dict()}
    row.shadow_compared, row.shadow_agreed = 4, 3
    return row


def fill(sessions, start, end, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    with sessions() as session, session.begin():
        ts = start + STEP
        while ts <= end:
            session.add(answered(ts, rng))
            session.add(answered(ts, rng, process="p2"))
            ts += STEP


def _rounded(value):
    """Sums added in another order differ in their last bits."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def canon(agg: SlotAggregate) -> dict:
    out = {}
    for field in dataclasses.fields(agg):
        value = getattr(agg, field.name)
        if isinstance(value, Histogram):
            value = value.counts
        elif field.name == "compute":
            value = {size: h.counts for size, h in value.items()}
        out[field.name] = _rounded(value)
    return out


def test_merging_two_aggregates_equals_adding_all_their_rows(sessions) -> None:
    fill(sessions, T0, T0 + timedelta(minutes=2))
    with sessions() as session:
        rows = list(session.scalars(select(SlotSample).order_by(SlotSample.ts)))
    whole, first, rest = SlotAggregate(), SlotAggregate(), SlotAggregate()
    for i, row in enumerate(rows):
        whole.add(row)
        (first if i < len(rows) // 3 else rest).add(row)
    merged = SlotAggregate()
    merged.merge(first)
    merged.merge(rest)
    assert canon(merged) == canon(whole)
    empty = canon(SlotAggregate())
    assert all(canon(whole)[name] != empty[name] for name in empty), "a field the rows left empty is not tested"
    merged.merge(rest)  # nothing of `rest` was shared: adding it again leaves `rest` as it was
    assert canon(rest) != canon(merged)


def test_kept_window_and_reference_sums_equal_reading_the_rows_look_after_look(sessions, monkeypatch) -> None:
    born = T0  # the version's first row: its reference is its first day, open throughout
    fill(sessions, born, born + timedelta(hours=3))
    windows, references = drift.WindowSums(), drift.ReferenceCache()
    read: list[timedelta] = []
    rows = drift._rows

    def counted(session, model, version, start, end, *columns):
        read.append(end - start)
        return rows(session, model, version, start, end, *columns)

    now = born + timedelta(minutes=70, seconds=7)
    for step in range(12):  # looks 15 s apart, as the drift rule's
        with sessions() as session:
            reference = drift.reference_of(session, "mlp", "1")
            read.clear()
            monkeypatch.setattr(drift, "_rows", counted)
            got_window = windows.get(session, "mlp", "1", now - timedelta(hours=1), now)
            got_reference = references.get(session, "mlp", "1", reference, now)
            monkeypatch.setattr(drift, "_rows", rows)
            assert canon(got_window) == canon(drift.aggregate(session, "mlp", "1", now - timedelta(hours=1), now))
            assert canon(got_reference) == canon(drift.aggregate(session, "mlp", "1", reference.start, now))
        if step:  # after the first look: the ragged ends (a minute, 10 to 11 minutes) and the newly settled minute
            assert sum(read, timedelta()) <= timedelta(minutes=25), read
        now += timedelta(seconds=15)


def test_a_row_that_came_late_is_counted_within_the_ttl(sessions) -> None:
    fill(sessions, T0, T0 + timedelta(hours=3))
    windows, now = drift.WindowSums(), T0 + timedelta(hours=2)
    start = lambda at: at - timedelta(hours=1)  # noqa: E731
    with sessions() as session:
        windows.get(session, "mlp", "1", start(now), now)
    with sessions() as session, session.begin():  # 30 minutes late: its minute was kept already
        session.add(answered(now - timedelta(minutes=30, seconds=5), np.random.default_rng(9)))
    later = now + timedelta(seconds=15)
    with sessions() as session:
        kept = canon(windows.get(session, "mlp", "1", start(later), later))
        read = canon(drift.aggregate(session, "mlp", "1", start(later), later))
    assert kept != read and kept["successes"] < read["successes"]  # kept: the late row is not read yet
    later = now + drift.KEPT_FOR
    with sessions() as session:
        assert canon(windows.get(session, "mlp", "1", start(later), later)) == canon(
            drift.aggregate(session, "mlp", "1", start(later), later)
        )


def test_when_a_version_first_served_is_kept_for_the_leaders_looks_only(sessions) -> None:
    rng, windows = np.random.default_rng(5), drift.WindowSums()
    now = T0 + timedelta(hours=2)
    with sessions() as session:
        assert drift.reference_of(session, "mlp", "1", windows, now) is None  # never served: not kept...
    with sessions() as session, session.begin():
        session.add_all([answered(T0 + timedelta(minutes=m), rng) for m in (10, 20)])
    with sessions() as session:
        first = drift.reference_of(session, "mlp", "1", windows, now + timedelta(seconds=15))  # ... counts at once
        assert first is not None and first.start < T0 + timedelta(minutes=10)
    with sessions() as session, session.begin():  # retention drops the first row: the day begins later
        session.delete(session.scalars(select(SlotSample).order_by(SlotSample.ts)).first())
    with sessions() as session:
        assert drift.reference_of(session, "mlp", "1", windows, now + timedelta(seconds=30)) == first  # kept
        assert drift.reference_of(session, "mlp", "1").start > first.start  # the API reads it fresh
        later = drift.reference_of(session, "mlp", "1", windows, now + drift.KEPT_FOR + timedelta(seconds=15))
        assert later.start > first.start  # read again once kept for its time


def test_two_databases_keep_their_own_sums(tmp_path, migrated_db) -> None:
    """Two databases in one process (tests, a CLI beside a server) hold the same model and version at the same
    times: the leader's looks at one must not use what was kept from the other."""
    import shutil

    from controlplane.db import make_engine, session_factory

    def database(name: str, seed: int):
        shutil.copyfile(migrated_db, tmp_path / name)
        sessions = session_factory(make_engine(f"sqlite:///{tmp_path / name}"))
        fill(sessions, T0, T0 + timedelta(hours=3), seed)
        return sessions

    first, second = database("a.db", 1), database("b.db", 2)
    now, window = T0 + timedelta(hours=3), timedelta(hours=1)
    for sessions in (first, second, first, second):  # each look after the other database's, at the same now
        with sessions() as session:
            looked = drift.drift_observation(session, window, ("feature",), 0, now)
            _, fresh = drift.drift(session, "mlp", "1", now - window, now)  # nothing kept: read whole
        expected = {}
        for score in fresh:
            key = (("feature", drift.feature_label(score)),)
            if score.score is not None and score.score > expected.get(key, -1.0):
                expected[key] = score.score
        assert {k: v for k, v in looked.items() if isinstance(v, float)} == pytest.approx(expected)
