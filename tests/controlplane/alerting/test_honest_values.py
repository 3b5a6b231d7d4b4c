"""Honest values, end to end: real history rows, the evaluator, the outbox, and a real HTTP receiver.

A RESOLVED message says why the alert resolved (back within the threshold, with the value now; no
data; not enough traffic), never the last firing value; rate rules need `min_requests` to judge.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, load_rules
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.alerting.outbox import deliver_due
from controlplane.models import AlertEvent, AlertRecord, OutboxMessage, Receiver
from tests.alerts.notifiers.recorder import deliver_local
from tests.controlplane.history.conftest import T0, latencies, slot_row
from tests.servers import ChatServer

RULES = Path(__file__).resolve().parents[3] / "alerts" / "rules"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def chat():
    with ChatServer() as server:
        yield server


@pytest.fixture
def evaluator(sessions, chat) -> tuple[AlertEvaluator, Clock]:
    """The default high_error_rate rule, a Slack receiver and an Alertmanager webhook, both on `chat`."""
    rules = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "high_error_rate"]
    with sessions() as s, s.begin():
        for name, kind in (("slack", "slack"), ("am", "webhook")):
            s.add(Receiver(name=name, kind=kind, config={"url": chat.url, "allow_http": True}, severities=["P0"],
                           matchers=[], enabled=True, created_at=T0))  # fmt: skip
    clock = Clock()
    ev = AlertEvaluator(sessions, rules, EvaluatorSettings(console_url="http://console"), lambda: True, clock=clock)
    return ev, clock


def traffic(sessions, start: datetime, minutes: int, *, errors: int, n: int) -> None:
    """One history row a minute for `minutes` minutes from `start`: `n` requests, `errors` of them failed."""
    with sessions() as s, s.begin():
        for minute in range(minutes):
            at = start + timedelta(minutes=minute, seconds=30)
            s.add(slot_row(at, latencies(minute, n), errors=errors))


def tick(sessions, ev: AlertEvaluator, clock: Clock, until: datetime) -> None:
    """Run the evaluator and then the outbox once a minute, as the leader's jobs do, up to `until`."""
    while clock.now < until:
        clock.now += timedelta(minutes=1)
        ev.run()
        deliver_due(sessions, now=clock.now, send=deliver_local)


def state(sessions) -> AlertRecord:
    with sessions() as s:
        return s.scalars(select(AlertRecord)).one()


def fire(sessions, ev: AlertEvaluator, clock: Clock) -> None:
    """20% of 200 requests fail each minute for 4 minutes: the alert fires and its message is delivered."""
    traffic(sessions, T0, 4, errors=40, n=200)
    tick(sessions, ev, clock, T0 + timedelta(minutes=5))
    assert state(sessions).state == "firing"


def resolved(chat: ChatServer) -> tuple[str, dict]:
    """Return the Slack RESOLVED section's text and the Alertmanager webhook's resolved alert."""
    slack = [b for b in chat.received if "blocks" in b and "RESOLVED" in b["blocks"][0]["text"]["text"]]
    webhook = [b for b in chat.received if b.get("version") == "4" and b["status"] == "resolved"]
    assert len(slack) == 1 and len(webhook) == 1, chat.received
    section = slack[0]["attachments"][0]["blocks"][0]["text"]["text"]
    return section, webhook[0]["alerts"][0]


def resolution_reason(sessions) -> str:
    """The reason on the timeline's entry for the change to resolved."""
    with sessions() as s:
        event = s.scalars(select(AlertEvent).where(AlertEvent.kind == "state", AlertEvent.state == "resolved")).one()
    return event.detail["reason"]


def test_a_resolved_message_after_traffic_stopped_says_no_data_not_the_last_firing_value(
    sessions, evaluator, chat
) -> None:
    ev, clock = evaluator
    fire(sessions, ev, clock)
    tick(sessions, ev, clock, T0 + timedelta(minutes=20))  # no rows after 3:30: the 5 minute window empties
    alert = state(sessions)
    assert (alert.state, alert.value) == ("resolved", None)
    assert "20.0%" not in alert.summary and "no data in the last 5m" in alert.summary
    section, webhook_alert = resolved(chat)
    assert "20.0%" not in section and "*Value:* `no data in the last 5m" in section
    assert webhook_alert["annotations"]["value"].startswith("no data in the last 5m")
    assert "20.0%" not in webhook_alert["annotations"]["summary"]
    assert resolution_reason(sessions).startswith("no data in the last 5m")


def test_a_resolved_message_below_the_threshold_shows_the_value_now(sessions, evaluator, chat) -> None:
    ev, clock = evaluator
    fire(sessions, ev, clock)
    traffic(sessions, clock.now, 20, errors=20, n=2000)  # 1% fail: back under the 5% threshold
    tick(sessions, ev, clock, T0 + timedelta(minutes=20))
    section, webhook_alert = resolved(chat)
    shown = re.search(r"textcls v1: (\d+\.\d)% of requests fail", section)
    assert shown is not None and float(shown.group(1)) <= 5.0 and "20.0%" not in section
    assert f"*Value:* `{shown.group(1)}%, no longer &gt; 5.0%`" in section  # Slack escapes '>'
    assert webhook_alert["annotations"]["value"] == f"{shown.group(1)}%, no longer > 5.0%"
    assert re.fullmatch(r"\d\.\d%, no longer > 5\.0%", resolution_reason(sessions))


def test_one_bad_request_out_of_two_is_not_enough_traffic_to_fire(sessions, evaluator, chat) -> None:
    ev, clock = evaluator
    traffic(sessions, T0, 10, errors=1, n=2)  # a 50% error rate, from two requests a minute
    for minute in (1, 4, 6, 10):
        tick(sessions, ev, clock, T0 + timedelta(minutes=minute))
        alert = state(sessions)
        assert (alert.state, alert.value) == ("inactive", None)
    assert alert.summary.endswith("(not enough traffic: 10 requests in 5m, fewer than the 20 needed)")
    assert "50" not in alert.summary
    with sessions() as s:
        assert s.scalars(select(OutboxMessage)).all() == []
    assert chat.received == []


def test_a_firing_alert_whose_traffic_dwindles_resolves_for_want_of_traffic(sessions, evaluator, chat) -> None:
    ev, clock = evaluator
    fire(sessions, ev, clock)
    traffic(sessions, clock.now, 20, errors=1, n=2)  # still 50% failing, but from a trickle
    tick(sessions, ev, clock, T0 + timedelta(minutes=20))
    section, webhook_alert = resolved(chat)
    assert re.search(r"\*Value:\* `not enough traffic: \d requests in 5m, fewer than the 20 needed`", section)
    assert "50.0%" not in section and "20.0%" not in section
    assert webhook_alert["annotations"]["value"].startswith("not enough traffic")
    assert resolution_reason(sessions).startswith("not enough traffic")
