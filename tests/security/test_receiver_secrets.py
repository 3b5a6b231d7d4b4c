"""Receiver secrets at rest: encrypted with a key kept outside the database, sealed at start, rotated by a command."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet
from sqlalchemy import select

from controlplane.alerting.outbox import deliver_due
from controlplane.alerting.secretbox import KEY_FILE, Keyring, is_sealed, seal_plaintext
from controlplane.auth import Role
from controlplane.cli import cli
from controlplane.clock import utcnow
from controlplane.config import ConfigError, load_settings
from controlplane.models import AuditEvent, OutboxMessage, Receiver
from tests.alerts.notifiers.recorder import deliver_local
from tests.controlplane.conftest import token_for
from tests.servers import ChatServer

SLACK = "https://hooks.slack.com/services/T0FLIGHT/B0DECK/slackpathsecret0123456789"
SECRETS = ("slackpathsecret0123456789", "feishu-signing-secret-42", "bearer-token-abcdef0123", "hooks.slack.com")
RECEIVERS = {
    "slack_ops": {"kind": "slack", "config": {"url": SLACK}},
    "feishu_ops": {"kind": "feishu", "config": {"url": "https://open.feishu.cn/open-apis/bot/v2/hook/0123abcd",
                                               "secret": "feishu-signing-secret-42"}},
    "hook_ops": {"kind": "webhook", "config": {"url": "https://alerts.example.net/in",
                                              "bearer_token": "bearer-token-abcdef0123"}},
}  # fmt: skip


def raw_database(home: Path) -> bytes:
    """Every byte SQLite keeps for the database: the file and its write-ahead log."""
    return b"".join(p.read_bytes() for p in sorted(home.glob("flightdeck.db*")))


def test_the_database_file_holds_no_webhook_url_or_secret(app, client, home: Path) -> None:
    admin = token_for(app, "ada", Role.ADMIN)
    for name, body in RECEIVERS.items():
        response = client.put(f"/api/receivers/{name}", json=body, headers=admin)
        assert response.status_code == 200, response.get_json()
    raw = raw_database(home)
    assert b"receivers" in raw  # the right file, and it was written
    for secret in SECRETS:
        assert secret.encode() not in raw, secret
    assert stat.S_IMODE((home / KEY_FILE).stat().st_mode) == 0o600
    # The server still opens them: the list describes each from its decrypted configuration.
    shown = {r["name"]: r for r in client.get("/api/receivers", headers=admin).get_json()["receivers"]}
    assert shown["slack_ops"]["url"] == "https://hooks.slack.com/***" and shown["feishu_ops"]["signed"] is True
    assert shown["hook_ops"]["auth"] == "bearer"


def _queue_one(sessions, receiver: str) -> None:
    alert = {"fingerprint": "f1", "name": "high_error_rate", "severity": "P0", "status": "firing",
             "labels": {"alertname": "high_error_rate"}, "starts_at": utcnow().isoformat()}  # fmt: skip
    with sessions() as s, s.begin():
        s.add(OutboxMessage(receiver=receiver, group_key="{}", status="firing", state="pending", attempts=0,
                            next_attempt_at=utcnow(), created_at=utcnow(),
                            payload={"receiver": receiver, "group_key": "{}", "status": "firing", "alerts": [alert]}))  # fmt: skip


def test_plaintext_rows_from_before_are_sealed_at_start_and_still_delivered(sessions, tmp_path: Path) -> None:
    keys = Keyring(tmp_path / KEY_FILE)
    keys.ensure()
    with ChatServer() as chat:
        url = f"{chat.url}?key=plaintext-secret-key-9876"
        with sessions() as s, s.begin():
            s.add(Receiver(name="old", kind="webhook", config={"url": url, "allow_http": True}, severities=["P0"],
                           matchers=[], enabled=True, created_at=utcnow()))  # fmt: skip
        assert b"plaintext-secret-key-9876" in raw_database(tmp_path)
        assert seal_plaintext(sessions, keys) == 1
        assert seal_plaintext(sessions, keys) == 0  # once is enough
        assert b"plaintext-secret-key-9876" not in raw_database(tmp_path)  # nor left behind in free space or the log
        _queue_one(sessions, "old")
        assert deliver_due(sessions, send=deliver_local, keys=keys)["sent"] == 1
        assert len(chat.received) == 1
        # Without the key the sealed row cannot be used: the message fails, saying why, and nothing is sent.
        _queue_one(sessions, "old")
        assert deliver_due(sessions, send=deliver_local)["failed"] == 1
        with sessions() as s:
            last = s.scalars(select(OutboxMessage).order_by(OutboxMessage.id.desc())).first()
            assert "encrypted" in last.last_error
        assert len(chat.received) == 1


def _stored(sessions) -> dict:
    with sessions() as s:
        return s.get(Receiver, "slack_ops").config


def test_rotate_key_re_encrypts_every_receiver_and_drops_the_old_key(app, client, home: Path, monkeypatch) -> None:
    admin = token_for(app, "ada", Role.ADMIN)
    assert client.put("/api/receivers/slack_ops", json=RECEIVERS["slack_ops"], headers=admin).status_code == 200
    sessions = app.extensions["flightdeck"].sessions
    old_keys = Keyring(home / KEY_FILE).keys()
    before = _stored(sessions)
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    result = CliRunner().invoke(cli, ["secrets", "rotate-key"])
    assert result.exit_code == 0, result.output
    assert "1 receiver(s) re-encrypted" in result.output
    new_keys = Keyring(home / KEY_FILE).keys()
    assert len(new_keys) == 1 and new_keys[0] not in old_keys
    after = _stored(sessions)
    assert is_sealed(after) and after != before
    assert Keyring(None, old_keys[0].decode()).open(before)["url"] == SLACK
    with pytest.raises(ValueError, match="cannot be decrypted"):
        Keyring(None, old_keys[0].decode()).open(after)  # the old key opens nothing any more
    assert Keyring(home / KEY_FILE).open(after)["url"] == SLACK
    # The running server notices the new file and keeps working without a restart.
    listed = client.get("/api/receivers", headers=admin).get_json()["receivers"]
    assert listed[0]["url"] == "https://hooks.slack.com/***"
    with sessions() as s:
        (event,) = s.scalars(select(AuditEvent).where(AuditEvent.action == "secrets.rotate")).all()
        assert event.outcome == "ok" and event.detail == {"receivers": 1}


def test_keys_from_the_environment_rotate_newest_first(app, client, home: Path, monkeypatch) -> None:
    admin = token_for(app, "ada", Role.ADMIN)
    assert client.put("/api/receivers/slack_ops", json=RECEIVERS["slack_ops"], headers=admin).status_code == 200
    sessions = app.extensions["flightdeck"].sessions
    old = Keyring(home / KEY_FILE).keys()[0].decode()
    new = Fernet.generate_key().decode()
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    monkeypatch.setenv("FLIGHTDECK_SECRET_KEYS", f"{new},{old}")
    result = CliRunner().invoke(cli, ["secrets", "rotate-key"])
    assert result.exit_code == 0, result.output
    assert "first key of FLIGHTDECK_SECRET_KEYS" in result.output
    assert Keyring(None, new).open(_stored(sessions))["url"] == SLACK  # the old key may now leave the variable
    monkeypatch.setenv("FLIGHTDECK_SECRET_KEYS", new)
    missing = CliRunner().invoke(cli, ["secrets", "rotate-key"])  # idempotent with the newest key alone
    assert missing.exit_code == 0, missing.output
    monkeypatch.setenv("FLIGHTDECK_SECRET_KEYS", Fernet.generate_key().decode())
    lost = CliRunner().invoke(cli, ["secrets", "rotate-key"])  # a replaced (not rotated) key: refused, unchanged
    assert lost.exit_code == 1 and "none of the configured keys opens" in lost.output
    assert Keyring(None, new).open(_stored(sessions))["url"] == SLACK


def test_a_malformed_key_is_refused_at_start_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={"FLIGHTDECK_SECRET_KEYS": f"{Fernet.generate_key().decode()},not-a-key-value"})
    assert "key 2 is not a Fernet key" in str(refused.value) and "not-a-key-value" not in str(refused.value)
