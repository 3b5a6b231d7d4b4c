"""The rules generated from the shipped SLOs, run by the real evaluator over history rows in a real SQLite file."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts.slo import burn_rules, load_slos
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.models import AlertRecord
from tests.controlplane.history.conftest import T0, slot_row

RULES = Path(__file__).resolve().parents[3] / "alerts" / "rules"
NOW = T0 + timedelta(days=2)


@pytest.fixture
def evaluator(sessions) -> AlertEvaluator:
    """The evaluator with only the textcls SLOs' eight rules (availability and latency, four windows each)."""
    slos = [s for s in load_slos(RULES) if s.model == "textcls"]
    return AlertEvaluator(
        sessions, burn_rules(slos), EvaluatorSettings(console_url="http://console"), engine_ready=lambda: True,
        clock=lambda: NOW,
    )  # fmt: skip


def traffic(sessions, span: timedelta, per_minute: int, bad: int, *, latency_s: float = 0.01, **kind: int) -> None:
    """One row a minute over `span` before NOW, as the sampler writes them: `bad` server errors in each."""
    with sessions() as s, s.begin():
        for minute in range(int(span.total_seconds() // 60)):
            at = NOW - timedelta(minutes=minute, seconds=30)
            s.add(slot_row(at, [latency_s] * per_minute, errors=bad, interval=60.0, **kind))


def firing(sessions) -> dict[str, str]:
    with sessions() as s:
        rows = s.scalars(select(AlertRecord).where(AlertRecord.state == "firing"))
        return {r.rule: r.severity for r in rows}


def test_a_fast_burn_pages_at_once(sessions, evaluator) -> None:
    # 2% of requests fail for the last 90 minutes: 20x a 0.1% budget, above 14.4 over 1h and 5m and 6 over 6h and 30m.
    traffic(sessions, timedelta(minutes=90), per_minute=200, bad=4)

    evaluator.run()

    assert firing(sessions) == {
        "textcls_availability_burn_1h": "P0",
        "textcls_availability_burn_6h": "P0",
        "textcls_availability_burn_1d": "P1",
        "textcls_availability_burn_3d": "P1",
    }
    with sessions() as s:
        alert = s.scalars(select(AlertRecord).where(AlertRecord.rule == "textcls_availability_burn_1h")).one()
    assert alert.labels == {"slo": "textcls_availability", "long": "1h", "short": "5m", "model": "textcls",
                            "alertname": "textcls_availability_burn_1h", "severity": "P0"}  # fmt: skip
    assert alert.value == pytest.approx(20.0)
    assert alert.summary == "textcls: the error budget of availability 99.9% over 30d burns at 20.0x over 1h and 5m"


def test_a_slow_burn_opens_a_ticket_and_never_pages(sessions, evaluator) -> None:
    # 0.4% of requests fail for 26 hours: 4x the budget, above 3 over 1d and 2h and 1 over 3d and 6h, below 6 and 14.4.
    traffic(sessions, timedelta(hours=26), per_minute=250, bad=1)

    evaluator.run()

    assert firing(sessions) == {"textcls_availability_burn_1d": "P1", "textcls_availability_burn_3d": "P1"}


def test_a_burn_that_stopped_resolves_the_page_through_the_short_window(sessions, evaluator) -> None:
    # The 1h window still holds the failures, but the last ten minutes are clean: the 5m window resets the page.
    with sessions() as s, s.begin():
        for minute in range(10, 60):
            s.add(slot_row(NOW - timedelta(minutes=minute), [0.01] * 200, errors=20, interval=60.0))
        for minute in range(10):
            s.add(slot_row(NOW - timedelta(minutes=minute, seconds=30), [0.01] * 200, interval=60.0))

    evaluator.run()

    assert "textcls_availability_burn_1h" not in firing(sessions)
    assert firing(sessions)["textcls_availability_burn_6h"] == "P0"  # 30 minutes still include failures


def test_client_errors_never_spend_the_availability_budget(sessions, evaluator) -> None:
    traffic(sessions, timedelta(minutes=90), per_minute=200, bad=0, client_errors=100)

    evaluator.run()

    assert firing(sessions) == {}


def test_slow_requests_burn_the_latency_budget(sessions, evaluator) -> None:
    # Every request takes 400 ms against "99% under 250 ms": 100x the 1% budget, on every window.
    traffic(sessions, timedelta(minutes=90), per_minute=100, bad=0, latency_s=0.4)

    evaluator.run()

    assert firing(sessions) == {f"textcls_latency_burn_{w}": sev for w, sev in
                                (("1h", "P0"), ("6h", "P0"), ("1d", "P1"), ("3d", "P1"))}  # fmt: skip


def test_no_traffic_is_no_alert(sessions, evaluator) -> None:
    evaluator.run()
    assert firing(sessions) == {}
