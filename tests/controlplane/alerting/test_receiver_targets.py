"""Receivers may not reach inside the deployment unless FLIGHTDECK_RECEIVER_ALLOW says so (issue 12, item 8)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from controlplane.auth import Role
from controlplane.config import ConfigError, load_settings
from controlplane.models import AuditEvent, Receiver
from tests.alerts.notifiers.recorder import RecordingServer
from tests.controlplane.conftest import token_for


@pytest.fixture
def allow() -> str:
    """The product default: no internal destination allowed (a test parametrizes `allow` to change it)."""
    return ""


@pytest.fixture
def app_config(app_config: dict, allow: str) -> dict:
    return app_config | {"receiver_allow": allow}


@pytest.fixture
def admin(app) -> dict[str, str]:
    return token_for(app, "ada", Role.ADMIN)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://127.0.0.1:8443/hook", "the host 127.0.0.1 is a loopback address"),
        ("http://127.0.0.1:9093/hook", "the host 127.0.0.1 is a loopback address"),
        ("https://[::1]/hook", "the host ::1 is a loopback address"),
        ("https://169.254.169.254/latest/meta-data/", "is a cloud metadata address"),
        ("https://[fe80::1]/hook", "is a link-local address"),
        ("https://10.1.2.3/hook", "is a private address"),
        ("https://localhost/hook", "the host localhost is a loopback name"),
    ],
)
def test_an_internal_destination_is_refused_when_saved(client, admin, url: str, reason: str) -> None:
    config = {"url": url, "allow_http": url.startswith("http:")}
    response = client.put("/api/receivers/chat", json={"kind": "webhook", "config": config}, headers=admin)
    assert response.status_code == 400
    message = response.get_json()["error"]["message"]
    assert reason in message and "FLIGHTDECK_RECEIVER_ALLOW" in message
    assert client.get("/api/receivers", headers=admin).get_json()["receivers"] == []


def test_a_public_destination_is_saved(client, admin) -> None:
    config = {"url": "https://hooks.slack.com/services/T0/B0/abcdefghijklmnop"}
    response = client.put("/api/receivers/chat", json={"kind": "slack", "config": config}, headers=admin)
    assert response.status_code == 200, response.get_json()


def test_a_stored_internal_receiver_is_refused_at_send_time_and_test_says_why(app, client, admin) -> None:
    with RecordingServer(200, b"internal") as inside:
        # As saved before the check existed (or through the database): only the send-time check stands.
        with app.extensions["flightdeck"].sessions() as s, s.begin():
            s.add(Receiver(name="old", kind="webhook", config={"url": inside.url + "/hook", "allow_http": True},
                           severities=["P0"], matchers=[], enabled=True, created_at=datetime.now(UTC)))  # fmt: skip
        answer = client.post("/api/receivers/old/test", headers=admin).get_json()
    assert answer["ok"] is False
    assert answer["error"].startswith("refused destination: the host 127.0.0.1 is a loopback address")
    assert inside.requests == []
    with app.extensions["flightdeck"].sessions() as s:
        event = s.scalars(select(AuditEvent).where(AuditEvent.action == "receiver.test")).one()
    assert event.outcome == "error"


@pytest.mark.parametrize("allow", ["127.0.0.1"])
def test_the_allow_list_lets_a_named_destination_through_and_test_never_echoes_its_body(client, admin) -> None:
    reply = b"<html>admin console: db password hunter2 ... " + b"x" * 400 + b"</html>"
    with RecordingServer(500, reply) as inside:
        config = {"url": inside.url + "/hook", "allow_http": True}
        saved = client.put("/api/receivers/chat", json={"kind": "webhook", "config": config}, headers=admin)
        assert saved.status_code == 200, saved.get_json()
        answer = client.post("/api/receivers/chat/test", headers=admin).get_json()
    assert len(inside.requests) == 1
    assert answer == {"ok": False, "error": "HTTP 500", "retry_after_s": None}


def test_a_malformed_allow_list_stops_the_start() -> None:
    with pytest.raises(ConfigError, match="FLIGHTDECK_RECEIVER_ALLOW"):
        load_settings(environ={"FLIGHTDECK_RECEIVER_ALLOW": "127.0.0.1,not a/network"})
    policy = load_settings(environ={"FLIGHTDECK_RECEIVER_ALLOW": "10.0.0.0/8 hooks.internal"}).receiver_targets
    assert [str(n) for n in policy.networks] == ["10.0.0.0/8"] and policy.hosts == {"hooks.internal"}
