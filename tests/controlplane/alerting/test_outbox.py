"""The outbox over a real HTTP receiver on 127.0.0.1: retries, Retry-After, nothing lost, secrets hidden."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from controlplane.alerting.outbox import deliver_due
from controlplane.models import OutboxMessage, Receiver
from tests.alerts.notifiers.recorder import deliver_local
from tests.controlplane.history.conftest import T0
from tests.servers import ChatServer


def queue(sessions, url: str) -> None:
    with sessions() as s, s.begin():
        s.add(Receiver(name="chat", kind="webhook", config={"url": url, "allow_http": True}, severities=["P0"],
                       matchers=[], enabled=True, created_at=T0))  # fmt: skip
        alert = {"fingerprint": "f1", "name": "high_error_rate", "severity": "P0", "status": "firing",
                 "labels": {"alertname": "high_error_rate", "model": "mlp"}, "annotations": {"summary": "mlp fails"},
                 "value": 0.2, "starts_at": T0.isoformat(), "runbook_command": "python runbooks/rollback.py --model mlp",
                 "console_url": "http://console/alerts/f1"}  # fmt: skip
        s.add(OutboxMessage(receiver="chat", group_key='{alertname="high_error_rate"}', status="firing", state="pending",
                            attempts=0, next_attempt_at=T0, created_at=T0,
                            payload={"receiver": "chat", "group_key": '{alertname="high_error_rate"}', "status": "firing",
                                     "alerts": [alert], "external_url": "http://console"}))  # fmt: skip


def test_a_failing_receiver_delays_but_does_not_lose_the_message(sessions) -> None:
    with ChatServer(failures=2) as chat:
        queue(sessions, chat.url)
        assert deliver_due(sessions, now=T0, send=deliver_local) == {"sent": 0, "retrying": 1, "failed": 0}
        assert deliver_due(sessions, now=T0 + timedelta(seconds=60), send=deliver_local) == {
            "sent": 0,
            "retrying": 0,
            "failed": 0,
        }
        with sessions() as s:
            first_retry = s.scalars(select(OutboxMessage)).one().next_attempt_at
        assert first_retry == T0 + timedelta(seconds=120)  # Retry-After beat the 30 s backoff
        assert deliver_due(sessions, now=first_retry, send=deliver_local)["retrying"] == 1
        with sessions() as s:
            message = s.scalars(select(OutboxMessage)).one()
        assert deliver_due(sessions, now=message.next_attempt_at, send=deliver_local) == {
            "sent": 1,
            "retrying": 0,
            "failed": 0,
        }
    (body,) = chat.received
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["alerts"][0]["labels"]["model"] == "mlp" and body["alerts"][0]["fingerprint"]
    with sessions() as s:
        message = s.scalars(select(OutboxMessage)).one()
        assert (message.state, message.attempts, message.last_error) == ("sent", 3, "")


def test_a_removed_receiver_fails_the_message_with_the_reason(sessions) -> None:
    queue(sessions, "http://127.0.0.1:9/hook")
    with sessions() as s, s.begin():
        s.delete(s.get(Receiver, "chat"))
    assert deliver_due(sessions, now=T0, send=deliver_local) == {"sent": 0, "retrying": 0, "failed": 1}
    with sessions() as s:
        assert "missing or disabled" in s.scalars(select(OutboxMessage)).one().last_error


@pytest.fixture
def admin(app):
    from controlplane.auth import Role
    from tests.controlplane.conftest import token_for

    return token_for(app, "ada", Role.ADMIN)


def test_receivers_api_validates_hides_secrets_and_sends_a_test(client, admin, operator) -> None:
    bad = client.put("/api/receivers/chat", json={"kind": "pager", "config": {"url": "https://x"}}, headers=admin)
    assert bad.status_code == 400 and "receiver config" in bad.get_json()["error"]["message"]
    assert (
        client.put("/api/receivers/chat", json={"kind": "webhook", "config": {}}, headers=operator).status_code == 403
    )
    with ChatServer() as chat:
        secret_url = chat.url + "?token=s3cr3t-value"
        put = client.put(
            "/api/receivers/chat",
            json={"kind": "webhook", "config": {"url": secret_url, "allow_http": True}, "severities": ["P0"]},
            headers=admin,
        )
        assert put.status_code == 200, put.get_json()
        listed = client.get("/api/receivers").get_json()
        assert "s3cr3t" not in json.dumps(listed) and listed["receivers"][0]["kind"] == "webhook"
        sent = client.post("/api/receivers/chat/test", headers=operator).get_json()
        assert sent == {"ok": True, "error": "", "retry_after_s": None}
    assert chat.received[0]["alerts"][0]["labels"]["alertname"] == "flightdeck_test"


def test_messages_are_paced_to_the_services_documented_rate(sessions) -> None:
    from alerts.notifiers.base import DeliveryResult

    sent = []
    with sessions() as s, s.begin():
        s.add(Receiver(name="chat", kind="dingtalk", config={"url": "https://oapi.dingtalk.com/robot/send?access_token=t"},
                       severities=["P0"], matchers=[], enabled=True, created_at=T0))  # fmt: skip
        for i in range(25):
            s.add(OutboxMessage(receiver="chat", group_key=f"g{i}", status="firing", state="pending", attempts=0,
                                next_attempt_at=T0, created_at=T0,
                                payload={"receiver": "chat", "group_key": f"g{i}", "status": "firing", "alerts": [
                                    {"fingerprint": "f", "name": "r", "severity": "P0", "status": "firing",
                                     "starts_at": T0.isoformat(), "annotations": {"summary": "s"}}]}))  # fmt: skip

    def record(notifier, note, now):
        sent.append(now)
        return DeliveryResult(ok=True)

    assert deliver_due(sessions, now=T0, send=record) == {"sent": 20, "retrying": 5, "failed": 0}  # 20 a minute
    with sessions() as s:
        waiting = s.scalars(select(OutboxMessage).where(OutboxMessage.state == "pending")).all()
        assert {m.next_attempt_at for m in waiting} == {T0 + timedelta(seconds=60)}
        assert {m.attempts for m in waiting} == {0}
    assert deliver_due(sessions, now=T0 + timedelta(seconds=60), send=record)["sent"] == 5


def queue_groups(sessions, url: str, groups: list[str]) -> None:
    """Queue one firing message per group key for a webhook receiver, oldest first."""
    with sessions() as s, s.begin():
        s.add(Receiver(name="chat", kind="webhook", config={"url": url, "allow_http": True}, severities=["P0"],
                       matchers=[], enabled=True, created_at=T0))  # fmt: skip
        for group in groups:
            alert = {"fingerprint": group, "name": "r", "severity": "P0", "status": "firing",
                     "labels": {"alertname": "r", "model": group}, "starts_at": T0.isoformat()}  # fmt: skip
            s.add(OutboxMessage(receiver="chat", group_key=group, status="firing", state="pending", attempts=0,
                                next_attempt_at=T0, created_at=T0,
                                payload={"receiver": "chat", "group_key": group, "status": "firing", "alerts": [alert]}))  # fmt: skip


def test_a_429_with_retry_after_holds_every_group_of_the_receiver_then_sends_in_order(sessions) -> None:
    from tests.alerts.notifiers.recorder import RecordingServer

    answers = iter([(429, {"Retry-After": "90"}, b"slow down")])
    with RecordingServer(answer=lambda _request: next(answers, (200, {}, b""))) as server:
        queue_groups(sessions, server.url + "/hook", ["a", "b", "c"])
        assert deliver_due(sessions, now=T0, send=deliver_local) == {"sent": 0, "retrying": 1, "failed": 0}
        later = T0 + timedelta(seconds=60)
        assert deliver_due(sessions, now=later, send=deliver_local) == {"sent": 0, "retrying": 0, "failed": 0}
        assert deliver_due(sessions, now=T0 + timedelta(seconds=90), send=deliver_local)["sent"] == 3
        models = [json.loads(r.body)["alerts"][0]["labels"]["model"] for r in server.requests]
    assert models == ["a", "a", "b", "c"]  # nothing went while the service asked us to wait


def test_a_later_message_of_a_group_waits_for_the_earlier_one(sessions) -> None:
    from tests.alerts.notifiers.recorder import RecordingServer

    answers = iter([(500, {}, b"oops")])  # no Retry-After: only this group waits, the receiver does not
    with RecordingServer(answer=lambda _request: next(answers, (200, {}, b""))) as server:
        queue_groups(sessions, server.url + "/hook", ["a", "a", "b"])
        assert deliver_due(sessions, now=T0, send=deliver_local) == {"sent": 1, "retrying": 1, "failed": 0}
        assert deliver_due(sessions, now=T0 + timedelta(seconds=30), send=deliver_local)["sent"] == 2
        models = [json.loads(r.body)["alerts"][0]["labels"]["model"] for r in server.requests]
    assert models == ["a", "b", "a", "a"]
    with sessions() as s:
        assert [m.state for m in s.scalars(select(OutboxMessage).order_by(OutboxMessage.id))] == ["sent"] * 3
