"""SLO counts, budget and burn rates over real history rows in a real SQLite file, and the API that shows them."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from alerts.rules import Insufficient
from alerts.slo import ALERT_WINDOWS, SLI, SLO, burn_rules
from controlplane.history.retention import RetentionPolicy, apply_retention
from controlplane.history.slo import ClosedHours, burn_observation, window_counts
from controlplane.history.slo import slo_status as status_of
from serving.histogram import GROWTH, bucket_of, lower_edge
from tests.controlplane.history.conftest import T0, minutes, slot_row

AVAILABILITY = SLO("textcls_availability", "textcls", SLI.AVAILABILITY, 0.999)
LATENCY = SLO("textcls_latency", "textcls", SLI.LATENCY, 0.99, threshold_ms=250)


def add(sessions, *rows) -> None:
    with sessions() as s, s.begin():
        s.add_all(rows)


def test_availability_counts_server_faults_timeouts_and_refusals_as_bad_never_client_errors(sessions) -> None:
    # 100 ran: 90 answered, 6 server errors, 4 refused for their own input (400); plus 3 timeouts and 2 refusals.
    add(sessions, slot_row(T0 - minutes(1), [0.01] * 100, errors=6, client_errors=4, timeouts=3, rejections=2))
    with sessions() as s:
        (counts,) = window_counts(s, AVAILABILITY, T0, [timedelta(minutes=5)])
    assert (counts.good, counts.bad, counts.total) == (94, 11, 105)


def test_rows_add_up_across_processes_versions_and_slots_within_each_window_only(sessions) -> None:
    add(
        sessions,
        slot_row(T0 - minutes(2), [0.01] * 100, errors=1, process="p1"),
        slot_row(T0 - minutes(3), [0.01] * 100, errors=2, process="p2", version="2", slot="green"),
        slot_row(T0 - minutes(30), [0.01] * 100, errors=10),  # inside 1h, outside 5m
        slot_row(T0 - timedelta(hours=2), [0.01] * 100, errors=50),  # outside both
        slot_row(T0 - minutes(1), [0.01] * 100, errors=100, model="mlp"),  # another model
        slot_row(T0 + minutes(1), [0.01] * 100, errors=100),  # after now
    )
    with sessions() as s:
        five, hour = window_counts(s, AVAILABILITY, T0, [minutes(5), timedelta(hours=1)])
    assert (five.bad, five.total) == (3, 200)
    assert (hour.bad, hour.total) == (13, 300)


def test_latency_counts_requests_within_the_threshold_among_those_that_ran(sessions) -> None:
    # Timeouts and refusals never ran: the availability SLO counts them, the latency SLO does not.
    add(sessions, slot_row(T0 - minutes(1), [0.05] * 90 + [0.4] * 8 + [2.0] * 2, errors=3, timeouts=7, rejections=5))
    with sessions() as s:
        (counts,) = window_counts(s, LATENCY, T0, [minutes(5)])
    assert (counts.good, counts.total) == (90, 100)


def test_the_threshold_bucket_counts_in_proportion_on_a_log_scale(sessions) -> None:
    edge = bucket_of(0.25)
    inside = lower_edge(edge) * GROWTH**0.5  # the middle of the threshold's bucket (log scale)
    add(sessions, slot_row(T0 - minutes(1), [inside] * 1000))
    with sessions() as s:
        (counts,) = window_counts(s, LATENCY, T0, [minutes(5)])
    share = math.log(0.25 / lower_edge(edge)) / math.log(GROWTH)
    assert counts.total == 1000 and counts.good == round(1000 * share)


def test_status_reports_budget_left_and_the_burn_rate_over_every_alert_window(sessions) -> None:
    # Ten days ago: 100,000 requests, 20 bad (0.02%). The last 30 minutes: 1,000 requests, 20 bad (2%: 20x).
    add(
        sessions,
        _big(errors=20),
        *[slot_row(T0 - minutes(m), [0.01] * 100, errors=2) for m in range(1, 30, 3)],
    )
    with sessions() as s:
        status = status_of(s, AVAILABILITY, T0)
    assert (status["good"], status["total"]) == (101_000 - 40, 101_000)
    # 40 bad of 101,000 is 0.0396%: 39.6% of a 0.1% budget spent.
    assert status["budget_remaining_percent"] == pytest.approx(100 - 40 / 101_000 / 0.001 * 100)
    burn = {b["window"]: b for b in status["burn_rates"]}
    assert list(burn) == ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]
    assert (burn["5m"]["total"], burn["5m"]["burn_rate"]) == (200, pytest.approx(20.0))  # rows at 1 and 4 minutes
    assert burn["1h"]["burn_rate"] == pytest.approx(20.0) and burn["3d"]["total"] == 1000
    alerts = {a["rule"]: (a["severity"], a["factor"], a["burning"]) for a in status["alerts"]}
    assert alerts == {
        "textcls_availability_burn_1h": ("P0", 14.4, True),
        "textcls_availability_burn_6h": ("P0", 6.0, True),
        "textcls_availability_burn_1d": ("P1", 3.0, True),
        "textcls_availability_burn_3d": ("P1", 1.0, False),  # 1,000 requests in 6h: a 1x burn needs 1,001
    }
    assert (status["objective_percent"], status["period"], status["sli"]) == (99.9, "30d", "availability")


def _big(errors: int):
    """One hour-resolution row, ten days ago, of 100,000 requests as retention leaves them."""
    row = slot_row(T0 - timedelta(days=10), [0.01] * 10, errors=0, interval=3600)
    row.successes, row.errors, row.resolution_s = 100_000 - errors, errors, 3600
    return row


def test_no_requests_is_no_budget_figure_rather_than_a_full_budget(sessions) -> None:
    with sessions() as s:
        status = status_of(s, LATENCY, T0)
    assert status["total"] == 0 and status["budget_remaining_percent"] is None
    assert all(b["burn_rate"] is None for b in status["burn_rates"])
    assert not any(a["burning"] for a in status["alerts"])


BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def test_the_api_answers_each_slo_with_its_figures(app, client) -> None:
    for _ in range(5):
        assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
    app.extensions["flightdeck"].sampler.sample()

    listed = client.get("/api/history/slos?model=mlp")
    assert listed.status_code == 200
    by_name = {s["name"]: s for s in listed.get_json()["slos"]}
    assert set(by_name) == {"mlp_availability", "mlp_latency"}
    availability = by_name["mlp_availability"]
    assert (availability["good"], availability["total"], availability["budget_remaining_percent"]) == (5, 5, 100.0)
    assert availability["burn_rates"][0] == {"window": "5m", "burn_rate": 0.0, "good": 5, "total": 5}
    one = client.get("/api/history/slos/mlp_latency")
    assert one.status_code == 200 and one.get_json()["threshold_ms"] == 250.0
    assert one.get_json()["total"] == 5
    every = {s["name"] for s in client.get("/api/history/slos").get_json()["slos"]}
    assert every == {"mlp_availability", "mlp_latency", "textcls_availability", "textcls_latency"}
    missing = client.get("/api/history/slos/nope")
    assert missing.status_code == 404 and "no SLO named 'nope'" in missing.get_json()["error"]["message"]
    assert datetime.fromisoformat(availability["end"]) <= datetime.now(UTC)


def test_a_burn_rule_gives_the_lower_rate_and_says_when_traffic_is_too_thin(sessions) -> None:
    # The last hour: 2% bad; the last five minutes: 10% bad. The rule's value is the lower: 20x.
    add(
        sessions,
        slot_row(T0 - minutes(30), [0.01] * 900, errors=10),
        slot_row(T0 - minutes(2), [0.01] * 100, errors=10),
    )
    fast, *_ = burn_rules([AVAILABILITY])
    with sessions() as s:
        assert burn_observation(s, fast, T0) == {(("model", "textcls"),): pytest.approx(20.0)}
        thin = replace(AVAILABILITY, min_requests=500)
        (observed,) = burn_observation(s, burn_rules([thin])[0], T0).values()
        assert observed == Insufficient("not enough traffic: 100 requests in 5m, fewer than the 500 needed")
        assert burn_observation(s, fast, T0 + timedelta(hours=2)) == {}  # no traffic in the window: no data


def _history_of_days(sessions, days: int, seed: int) -> None:
    """Rows every few minutes over `days` before T0 + 2 h, some on the hour, with errors and slow requests."""
    rng = np.random.default_rng(seed)
    rows, ts = [], T0 - timedelta(days=days)
    while ts < T0 + timedelta(hours=2):
        on_the_hour = ts.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        ts = on_the_hour if rng.random() < 0.1 else ts + timedelta(seconds=float(rng.integers(60, 600)))
        slow = int(rng.integers(0, 5))
        rows.append(slot_row(ts, [0.01] * int(rng.integers(5, 40)) + [0.4] * slow, errors=int(rng.integers(0, 3))))
    add(sessions, *rows)


@pytest.mark.parametrize("slo", [AVAILABILITY, LATENCY], ids=["availability", "latency"])
def test_kept_hours_count_exactly_what_reading_every_row_counts(sessions, slo) -> None:
    # Evaluations every few minutes, as the alert job's, keep whole past hours and read only the ragged ends;
    # a retention pass in between rolls raw rows up (into the same hours) and must not change a count.
    _history_of_days(sessions, days=4, seed=3)
    closed = ClosedHours()
    windows = [*ALERT_WINDOWS, slo.period]
    for step, now in enumerate(T0 + timedelta(minutes=m) for m in (0, 7, 13, 61, 75, 119)):
        if step == 3:
            with sessions() as s:
                rolled = apply_retention(s, now, RetentionPolicy(raw=timedelta(hours=6)))
            assert rolled["raw_rolled_up"] > 100
        with sessions() as s:
            kept = window_counts(s, slo, now, windows, closed)
            every_row = window_counts(s, slo, now, windows)
        assert kept == every_row, now
        assert every_row[ALERT_WINDOWS.index(timedelta(days=3))].total > 5_000  # the long windows hold traffic


def test_a_kept_hour_is_read_again_once_kept_for_its_time(sessions) -> None:
    clock = [0.0]
    closed = ClosedHours(clock=lambda: clock[0])
    add(sessions, slot_row(T0 - timedelta(hours=3), [0.01] * 100))
    three_hours = [timedelta(hours=3, minutes=30)]
    with sessions() as s:
        assert window_counts(s, AVAILABILITY, T0, three_hours, closed)[0].total == 100
    # A late row in a closed hour (a node whose clock is behind): the kept hour does not see it at once...
    add(sessions, slot_row(T0 - timedelta(hours=2, minutes=30), [0.01] * 10, errors=10))
    with sessions() as s:
        assert window_counts(s, AVAILABILITY, T0, three_hours, closed)[0].total == 100
        # ... while a row in the open hours counts at once,
        add(sessions, slot_row(T0 - minutes(5), [0.01] * 1))
        assert window_counts(s, AVAILABILITY, T0, three_hours, closed)[0].total == 101
    # ... and the closed one once it has been kept for its time.
    clock[0] = ClosedHours.TTL_S
    with sessions() as s:
        counts = window_counts(s, AVAILABILITY, T0, three_hours, closed)[0]
    assert (counts.total, counts.bad) == (111, 10)


def test_the_burn_rules_of_one_slo_share_one_reading_per_evaluation(sessions) -> None:
    add(sessions, slot_row(T0 - minutes(2), [0.01] * 100, errors=10))
    closed = ClosedHours()
    rules = burn_rules([AVAILABILITY])
    with sessions() as s:
        first = [burn_observation(s, rule, T0, closed) for rule in rules]
        add(sessions, slot_row(T0 - minutes(1), [0.01] * 100, errors=90))
        # The same evaluation (same now) does not read again, so its four rules judge the same rows...
        assert [burn_observation(s, rule, T0, closed) for rule in rules] == first
        # ... and the next evaluation reads the new row.
        later = burn_observation(s, rules[0], T0 + timedelta(seconds=15), closed)
    assert first[0] == {(("model", "textcls"),): pytest.approx(100.0)}
    assert later == {(("model", "textcls"),): pytest.approx(500.0)}


def test_a_young_history_reads_no_ring_that_ended_before_its_first_row(sessions, monkeypatch) -> None:
    """A server minutes old: the 1-day and 3-day windows' rings before its first row are empty, not read."""
    from controlplane.history import slo as slo_module

    now = T0 + timedelta(minutes=7, seconds=30)  # not on the hour: the long windows begin inside an hour
    first = now - minutes(30)  # on the 30-minute window's start: the ring ending there holds the row
    add(sessions, slot_row(first, [0.01] * 10, errors=1), slot_row(now - minutes(3), [0.01] * 5))
    spans: list = []
    real = slo_module._read

    def read(session, sli, model, asked):
        spans.extend(asked)
        return real(session, sli, model, asked)

    monkeypatch.setattr(slo_module, "_read", read)
    with sessions() as s:
        counts = window_counts(s, AVAILABILITY, now, ALERT_WINDOWS, ClosedHours())
    totals = dict(zip(ALERT_WINDOWS, (c.total for c in counts), strict=True))
    # A window is (start, now]: the first row, on the 30-minute window's start, counts in the longer ones only.
    assert totals == {w: 15 if w > minutes(30) else 5 for w in ALERT_WINDOWS}
    assert spans and all(end >= first for _, end in spans), spans


def test_a_models_first_row_is_read_once_for_all_its_slos_and_kept_for_its_time(sessions, monkeypatch) -> None:
    from controlplane.history import slo as slo_module

    clock = [0.0]
    closed = ClosedHours(clock=lambda: clock[0])
    asked: list[str] = []
    real = slo_module._first_row
    monkeypatch.setattr(slo_module, "_first_row", lambda session, model: asked.append(model) or real(session, model))
    now, one_day = T0 + timedelta(minutes=7, seconds=30), [timedelta(days=1)]  # the day begins inside an hour
    with sessions() as s:
        assert window_counts(s, AVAILABILITY, now, one_day, closed)[0].total == 0
        # No rows yet is not kept: the model's first rows count at once.
        add(sessions, slot_row(now - minutes(5), [0.01] * 100))
        assert window_counts(s, AVAILABILITY, now, one_day, closed)[0].total == 100
        assert window_counts(s, LATENCY, now, one_day, closed)[0].total == 100
        assert asked == ["textcls", "textcls"]  # the latency SLO used the kept first row
        # A late row in the day's ragged first hour, before the kept first row, counts once that is kept for its time.
        add(sessions, slot_row(now - timedelta(hours=23, minutes=55), [0.01] * 10))
        assert window_counts(s, AVAILABILITY, now + timedelta(seconds=15), one_day, closed)[0].total == 100
        clock[0] = ClosedHours.TTL_S
        assert window_counts(s, AVAILABILITY, now + timedelta(seconds=30), one_day, closed)[0].total == 110
    assert asked == ["textcls"] * 3
