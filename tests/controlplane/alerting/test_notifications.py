"""Issue 15's notification defects, each over the real evaluator, outbox and an HTTP receiver on 127.0.0.1.

Time is the evaluator's clock and the outbox's `now`: history rows, alert state and outbox rows
are real (SQLite), and every message crosses a real socket to a recording server.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, Rule, load_rules
from alerts.states import Severity
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.alerting.outbox import deliver_due
from controlplane.models import AlertEvent, OutboxMessage, Receiver, SilenceRecord
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer, deliver_local
from tests.controlplane.history.conftest import T0, latencies, slot_row
from tests.servers import ChatServer

RULES = Path(__file__).resolve().parents[3] / "alerts" / "rules"
GROUP_KEY = '{}/{severity=~"P0|P1|P2"}:{alertname="high_error_rate"}'
DINGTALK_OK = (200, {"Content-Type": "application/json"}, b'{"errcode": 0, "errmsg": "ok"}')
DINGTALK_TOO_FAST = (200, {"Content-Type": "application/json"}, b'{"errcode": 130101, "errmsg": "send too fast"}')


def error_rule(name: str = "high_error_rate", severity: Severity = Severity.P0) -> Rule:
    """The shipped error-rate rule, firing at once (no `for`) and starting no runbook."""
    (rule,) = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "high_error_rate"]
    return replace(
        rule, name=name, severity=severity, for_=timedelta(0), automatic=replace(rule.automatic, enabled=False)
    )


class World:
    """The evaluator over a fake clock, history rows, and the outbox at the same clock."""

    def __init__(self, sessions, rules: list[Rule]) -> None:
        self.sessions = sessions
        self.now = T0
        self.evaluator = AlertEvaluator(sessions, rules, EvaluatorSettings(console_url="http://console"),
                                        engine_ready=lambda: True, clock=lambda: self.now)  # fmt: skip

    def receiver(self, name: str, kind: str, url: str, severities=("P0", "P1", "P2"), **route) -> None:
        route = {"group_wait_s": 0.0, "group_interval_s": 60.0} | route
        with self.sessions() as s, s.begin():
            s.add(Receiver(name=name, kind=kind, config={"url": url, "allow_http": True}, severities=list(severities),
                           matchers=[], enabled=True, created_at=T0, **route))  # fmt: skip

    def traffic(self, minutes: range, errors: int, model: str = "textcls") -> None:
        with self.sessions() as s, s.begin():
            for minute in minutes:
                at = T0 + timedelta(minutes=minute, seconds=30)
                s.add(slot_row(at, latencies(minute, 200), errors=errors, model=model))

    def at(self, minutes: float) -> dict[str, int]:
        """Evaluate at T0 + `minutes`, then deliver what is due."""
        self.now = T0 + timedelta(minutes=minutes)
        self.evaluator.run()
        return deliver_due(self.sessions, now=self.now, send=deliver_local)

    def outbox(self) -> list[OutboxMessage]:
        with self.sessions() as s:
            return list(s.scalars(select(OutboxMessage).order_by(OutboxMessage.id)))

    def timeline(self, kind: str) -> list[AlertEvent]:
        with self.sessions() as s:
            return list(s.scalars(select(AlertEvent).where(AlertEvent.kind == kind)))


@pytest.mark.parametrize("mute", ["silence", "inhibition"])
def test_a_muted_alert_sends_neither_firing_nor_resolved_and_is_recorded_once(sessions, mute: str) -> None:
    rules = [error_rule(), error_rule("errors_p1", Severity.P1)]
    world = World(sessions, rules)
    if mute == "silence":
        with sessions() as s, s.begin():
            s.add(SilenceRecord(matchers=[{"label": "model", "value": "textcls"}], starts_at=T0, author="alice",
                                ends_at=T0 + timedelta(hours=1), comment="known", created_at=T0))  # fmt: skip
    with ChatServer() as chat:
        # P1 only: with a silence nothing reaches it; without, the P0 on the same model inhibits the P1.
        world.receiver("chat", "webhook", chat.url, severities=["P1"])
        world.traffic(range(0, 2), errors=40)
        world.traffic(range(2, 10), errors=0)
        for minute in (1, 1.5, 2, 2.5):
            world.at(minute)
        world.at(9)  # resolved
        world.at(10)
    assert chat.received == []
    assert world.outbox() == []
    suppressed = [e for e in world.timeline("suppressed") if e.detail["why"] != "silenced" or mute == "silence"]
    assert len([e for e in suppressed if e.fingerprint == suppressed[0].fingerprint]) == 1  # once per episode


def test_a_rate_limited_receiver_holds_every_message_and_a_stale_firing_is_superseded(sessions) -> None:
    answers = iter([DINGTALK_TOO_FAST])
    world = World(sessions, [error_rule()])
    with RecordingServer(answer=lambda _request: next(answers, DINGTALK_OK)) as bot:
        world.receiver("bot", "dingtalk", bot.url + "/robot/send?access_token=t", group_by=["alertname", "model"])
        world.traffic(range(0, 2), errors=40, model="textcls")
        world.traffic(range(2, 10), errors=0, model="textcls")
        assert world.at(1) == {"sent": 0, "retrying": 1, "failed": 0}  # 130101: the robot is throttled 10 min
        world.traffic(range(0, 12), errors=40, model="mlp")
        assert world.at(2) == {"sent": 0, "retrying": 0, "failed": 0}  # mlp's group waits behind it
        assert world.at(9)["sent"] == 0  # textcls resolved while its firing waited: nothing more to say
        assert world.at(11) == {"sent": 1, "retrying": 0, "failed": 0}
        bodies = [json.loads(r.body) for r in bot.requests]
    texts = [b["markdown"]["text"] for b in bodies]
    assert len(texts) == 2 and "textcls" in texts[0] and "mlp" in texts[1] and "textcls" not in texts[1]
    assert bodies[0]["msgUuid"] != bodies[1]["msgUuid"]
    states = [(m.group_key.rsplit("model=", 1)[1], m.status, m.state) for m in world.outbox()]
    assert states == [('"textcls"}', "firing", "superseded"), ('"mlp"}', "firing", "sent")]


def test_the_webhook_gets_one_message_per_group_with_alertmanagers_keys(sessions) -> None:
    world = World(sessions, [error_rule()])
    with ChatServer() as chat:
        world.receiver("chat", "webhook", chat.url)
        world.traffic(range(0, 2), errors=40, model="textcls")
        world.traffic(range(2, 10), errors=0, model="textcls")
        world.traffic(range(0, 16), errors=40, model="mlp")
        world.traffic(range(16, 24), errors=0, model="mlp")
        world.at(1)
        world.at(9)  # textcls resolved, mlp still fails
        world.at(23)
    first, second, third = chat.received
    assert len(first["alerts"]) == 2 and first["status"] == "firing" and first["truncatedAlerts"] == 0
    assert first["groupLabels"] == {"alertname": "high_error_rate"} and first["groupKey"] == GROUP_KEY
    assert first["commonLabels"] == {"alertname": "high_error_rate", "severity": "P0", "version": "1"}
    assert second["status"] == "firing", "no resolved for a group that still has a firing alert"
    assert sorted((a["labels"]["model"], a["status"]) for a in second["alerts"]) == [
        ("mlp", "firing"),
        ("textcls", "resolved"),
    ]
    assert third["status"] == "resolved" and [a["labels"]["model"] for a in third["alerts"]] == ["mlp"]
    assert {m["groupKey"] for m in chat.received} == {GROUP_KEY}


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_dingtalk_retries_a_lost_answer_with_the_same_msguuid_and_counts_every_attempt(sessions) -> None:
    answers = iter([None])  # the first answer is lost: the connection closes unanswered
    world = World(sessions, [error_rule()])
    retries = counter("flightdeck_notification_attempts_total", receiver="bot", kind="dingtalk", outcome="retry")
    sent = counter("flightdeck_notifications_total", receiver="bot", outcome="sent")
    with RecordingServer(answer=lambda _request: next(answers, DINGTALK_OK)) as bot:
        world.receiver("bot", "dingtalk", bot.url + "/robot/send?access_token=t")
        world.traffic(range(0, 2), errors=40)
        world.traffic(range(2, 10), errors=0)
        assert world.at(1) == {"sent": 0, "retrying": 1, "failed": 0}
        (message,) = world.outbox()
        assert message.maybe_delivered and "network error" in message.last_error
        assert world.at(9) == {"sent": 1, "retrying": 0, "failed": 0}  # the firing is superseded; its end is sent
        bodies = [json.loads(r.body) for r in bot.requests]
    assert len(bodies) == 2 and re.fullmatch(r"[0-9a-f]{32}", bodies[0]["msgUuid"])
    assert "RESOLVED" in bodies[1]["markdown"]["title"]  # it may have arrived, so its end is told
    assert counter("flightdeck_notification_attempts_total", receiver="bot", kind="dingtalk", outcome="retry") == (
        retries + 1
    )
    assert counter("flightdeck_notifications_total", receiver="bot", outcome="sent") == sent + 1


def test_a_retry_carries_the_same_idempotency_key(sessions) -> None:
    answers = iter([None])
    world = World(sessions, [error_rule()])
    with RecordingServer(answer=lambda _request: next(answers, DINGTALK_OK)) as bot:
        world.receiver("bot", "dingtalk", bot.url + "/robot/send?access_token=t")
        world.traffic(range(0, 4), errors=40)
        world.at(1)
        (message,) = world.outbox()
        assert deliver_due(sessions, now=message.next_attempt_at, send=deliver_local)["sent"] == 1
        first, retry = (json.loads(r.body) for r in bot.requests)
    assert first == retry and first["msgUuid"]


def test_a_webhook_resend_carries_the_same_idempotency_key_header_and_a_new_message_a_new_one(sessions) -> None:
    # The first answer is lost, as when a leader dies mid-send: the message stays pending and is sent again
    # (by the next leader, from the same outbox row). A receiver must be able to tell that from a real repeat.
    answers = iter([None])
    world = World(sessions, [error_rule()])
    with RecordingServer(answer=lambda _request: next(answers, (200, {}, b""))) as hook:
        world.receiver("hook", "webhook", hook.url + "/hook")
        world.traffic(range(0, 4), errors=40)
        world.traffic(range(4, 12), errors=0)
        world.at(1)
        (message,) = world.outbox()
        assert deliver_due(sessions, now=message.next_attempt_at, send=deliver_local)["sent"] == 1
        world.at(11)  # resolved: a new message
        first, resend, resolved = hook.requests
    assert first.body == resend.body and json.loads(first.body)["groupKey"] == GROUP_KEY
    assert first.headers["idempotency-key"] == resend.headers["idempotency-key"]
    assert re.fullmatch(r"[0-9a-f]{32}", first.headers["idempotency-key"])
    assert json.loads(resolved.body)["status"] == "resolved"
    assert resolved.headers["idempotency-key"] != first.headers["idempotency-key"]
    assert json.loads(resolved.body)["groupKey"] == GROUP_KEY  # groupKey names the group, not the message


def alertmanager_consumer_accepts(body: dict) -> list[str]:
    """What an Alertmanager webhook consumer checks (alertmanager's template.Data): an empty list if it takes it."""
    problems = []
    rfc3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)"
    if body.get("version") != "4" or body.get("status") not in ("firing", "resolved"):
        problems.append("version/status")
    if not str(body.get("externalURL", "")).startswith(("http://", "https://")):
        problems.append("externalURL")
    if not re.fullmatch(r"\{.*\}:\{.*\}", body.get("groupKey", "")):
        problems.append("groupKey")
    for alert in body.get("alerts") or [None]:
        if alert is None:
            problems.append("no alerts")
            continue
        if not re.fullmatch(r"[0-9a-f]{16}", alert.get("fingerprint", "")):
            problems.append(f"fingerprint {alert.get('fingerprint')!r}")
        if not str(alert.get("generatorURL", "")).startswith(("http://", "https://")):
            problems.append("generatorURL")
        if not re.fullmatch(rfc3339, alert.get("startsAt", "")) or not re.fullmatch(rfc3339, alert.get("endsAt", "")):
            problems.append("times")
        if "alertname" not in alert.get("labels", {}):
            problems.append("alertname")
    return problems


@pytest.fixture
def admin(app):
    from controlplane.auth import Role
    from tests.controlplane.conftest import token_for

    return token_for(app, "ada", Role.ADMIN)


def test_the_webhook_test_message_is_a_valid_alertmanager_body(client, admin, operator) -> None:
    with ChatServer() as chat:
        receiver = {"kind": "webhook", "config": {"url": chat.url, "allow_http": True}, "group_wait": "10s"}
        assert client.put("/api/receivers/chat", json=receiver, headers=admin).status_code == 200
        assert client.post("/api/receivers/chat/test", headers=operator).get_json()["ok"] is True
    (body,) = chat.received
    assert alertmanager_consumer_accepts(body) == []
    assert body["groupLabels"] == {"alertname": "flightdeck_test"}
    assert body["groupKey"] == '{}/{severity=~"P0|P1|P2"}:{alertname="flightdeck_test"}'


SUCCESS = {
    "slack": (200, {}, b"ok"),
    "feishu": (200, {"Content-Type": "application/json"}, b'{"code": 0, "msg": "success"}'),
    "dingtalk": DINGTALK_OK,
    "wecom": (200, {"Content-Type": "application/json"}, b'{"errcode": 0, "errmsg": "ok"}'),
    "teams": (202, {}, b""),
    "discord": (204, {}, b""),
    "webhook": (200, {}, b""),
}


@pytest.mark.parametrize("kind", sorted(SUCCESS))
def test_every_receiver_kind_takes_the_test_message(sessions, kind: str) -> None:
    from controlplane.alerting import service
    from controlplane.auth import Actor, Role
    from controlplane.auth.audit import audit_as

    with RecordingServer(*SUCCESS[kind][::2], headers=SUCCESS[kind][1]) as server:
        World(sessions, []).receiver("chat", kind, server.url + "/hook?key=k")
        with sessions() as s:
            ops = audit_as(Actor(name="ops", role=Role.OPERATOR, kind="cli"))
            result = service.send_test_message(
                s, "chat", ops, datetime.now(T0.tzinfo), console_url="http://console", targets=LOOPBACK
            )
        (request,) = server.requests
    assert result.ok, result.error
    assert "Test message from Flightdeck to chat" in request.body.decode()


def test_the_notifications_api_shows_the_outbox_for_scripts(app, client, viewer) -> None:
    sessions = app.extensions["flightdeck"].sessions
    with sessions() as s, s.begin():
        for state, attempts in (("sent", 1), ("pending", 3), ("superseded", 0)):
            s.add(OutboxMessage(receiver="chat", group_key=GROUP_KEY, status="firing", state=state, attempts=attempts,
                                next_attempt_at=T0, created_at=T0, last_error="HTTP 503" if attempts > 1 else "",
                                payload={"alerts": [{"fingerprint": "f1"}]}))  # fmt: skip
    listed = client.get("/api/notifications", headers=viewer).get_json()["notifications"]
    assert [(n["state"], n["attempts"]) for n in listed] == [("superseded", 0), ("pending", 3), ("sent", 1)]
    pending = client.get("/api/notifications?state=pending&receiver=chat", headers=viewer).get_json()["notifications"]
    (only,) = pending
    assert only["next_attempt_at"] == T0.isoformat() and only["last_error"] == "HTTP 503"
    assert only["group_key"] == GROUP_KEY and only["alerts"] == ["f1"] and only["status"] == "firing"
    assert client.get("/api/notifications?state=lost", headers=viewer).status_code == 400
    assert client.get("/api/notifications?limit=1", headers=viewer).get_json()["notifications"][0]["state"] == (
        "superseded"
    )


def test_a_receivers_route_is_set_checked_and_shown(client, admin) -> None:
    base = {"kind": "webhook", "config": {"url": "https://hooks.example/am"}}
    cases = [
        ({"group_wait": "forever"}, "duration must look like"),
        ({"group_interval": "0s"}, "longer than 0s"),
        ({"group_by": ["model", "bad label"]}, "'group_by' must list label names"),
    ]
    for route, message in cases:
        response = client.put("/api/receivers/chat", json=base | route, headers=admin)
        assert response.status_code == 400 and message in response.get_json()["error"]["message"], route
    plain = client.put("/api/receivers/chat", json=base, headers=admin).get_json()
    assert (plain["group_by"], plain["group_wait"], plain["group_interval"], plain["repeat_interval"]) == (
        ["alertname"], "30s", "5m", None,
    )  # fmt: skip
    route = {"group_by": ["alertname", "model"], "group_wait": "0s", "group_interval": "90s", "repeat_interval": "1d"}
    shown = client.put("/api/receivers/chat", json=base | route, headers=admin).get_json()
    assert {k: shown[k] for k in route} == {**route, "group_interval": "90s", "repeat_interval": "1d"}


def test_a_waiting_firing_that_a_silence_now_covers_is_withdrawn_and_told_afresh_after_it(sessions) -> None:
    world = World(sessions, [error_rule()])
    withdrawn = counter("flightdeck_notifications_total", receiver="chat", outcome="withdrawn")
    with ChatServer(failures=1, retry_after_s=1) as chat:
        world.receiver("chat", "webhook", chat.url, group_interval_s=60.0, repeat_interval_s=86400.0)
        world.traffic(range(0, 12), errors=40)
        assert world.at(1)["retrying"] == 1  # the receiver is down: the FIRING waits in the outbox
        with sessions() as s, s.begin():
            s.add(SilenceRecord(matchers=[{"label": "model", "value": "textcls"}], starts_at=world.now,
                                author="alice", ends_at=world.now + timedelta(minutes=3), comment="known",
                                created_at=world.now))  # fmt: skip
        assert deliver_due(sessions, now=world.now + timedelta(seconds=5), send=deliver_local)["sent"] == 0
        (message,) = world.outbox()
        assert message.state == "withdrawn" and "silenced" in message.last_error
        assert [e.detail["why"] for e in world.timeline("withdrawn")] == ["silenced"]
        world.at(2)
        world.at(3)
        assert chat.received == []  # nothing while the silence holds
        world.at(4.5)  # the silence ended at 4: the receiver never heard it, so it is news at the next tick
    (body,) = chat.received
    assert body["status"] == "firing" and [a["status"] for a in body["alerts"]] == ["firing"]
    assert counter("flightdeck_notifications_total", receiver="chat", outcome="withdrawn") == withdrawn + 1
