"""The SLO counts on a real PostgreSQL (a throwaway cluster, tests/pg.py): its JSON functions differ from SQLite's."""

from __future__ import annotations

from datetime import timedelta

from alerts.slo import SLI, SLO
from controlplane.history.slo import window_counts
from tests.controlplane.history.conftest import T0, minutes, slot_row


def test_latency_and_availability_counts_match_sqlites(pg_sessions) -> None:
    with pg_sessions() as s, s.begin():
        s.add(slot_row(T0 - minutes(1), [0.05] * 90 + [0.4] * 10, errors=3, client_errors=2, timeouts=4))
        s.add(slot_row(T0 - minutes(30), [0.05] * 50, errors=5, process="p2"))
        s.add(slot_row(T0 - minutes(1), [2.0] * 50, model="mlp"))
    latency = SLO("l", "textcls", SLI.LATENCY, 0.99, threshold_ms=250)
    availability = SLO("a", "textcls", SLI.AVAILABILITY, 0.999)
    windows = [minutes(5), timedelta(hours=1)]

    with pg_sessions() as s:
        five, hour = window_counts(s, latency, T0, windows)
        assert (five.good, five.total, hour.good, hour.total) == (90, 100, 140, 150)
        five, hour = window_counts(s, availability, T0, windows)
        assert (five.bad, five.total, hour.bad, hour.total) == (7, 104, 12, 154)
