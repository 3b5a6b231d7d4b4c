"""Login sessions end when idle or too old, last use is written once a minute, and admins list and revoke them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select, update

from controlplane.auth import Role
from controlplane.models import AuditEvent, LoginSession
from tests.controlplane.conftest import log_in, token_for

AGENT = "Mozilla/5.0 (X11; Linux x86_64) FlightdeckTest/1.0"


@pytest.fixture(autouse=True)
def idle_after_ten_minutes(app_config: dict) -> None:
    app_config.update(session_idle_minutes=10, session_hours=2)


def _rows(app: Flask) -> list[LoginSession]:
    with app.extensions["flightdeck"].sessions() as db:
        return list(db.scalars(select(LoginSession).order_by(LoginSession.id)))


def _shift(app: Flask, **values: datetime) -> None:
    """Move every session's clock columns, as time passing would (the server's clock is the real one)."""
    with app.extensions["flightdeck"].sessions() as db:
        db.execute(update(LoginSession).values(**values))
        db.commit()


def _signed_in(client: FlaskClient) -> bool:
    return client.get("/api/session").get_json()["authenticated"]


def test_a_session_unused_for_the_idle_timeout_is_refused_and_deleted(app, client) -> None:
    log_in(client, app, "vic", Role.VIEWER)
    assert _signed_in(client)
    _shift(app, last_used_at=datetime.now(UTC) - timedelta(minutes=9))
    assert _signed_in(client)  # nine idle minutes of ten: still fine, and this use is recorded
    assert _rows(app)[0].last_used_at > datetime.now(UTC) - timedelta(minutes=1)
    _shift(app, last_used_at=datetime.now(UTC) - timedelta(minutes=10, seconds=1))
    assert client.get("/api/tokens").status_code == 401
    assert _rows(app) == []  # gone for good: using it again later cannot revive it


def test_a_session_past_its_absolute_lifetime_ends_however_busy(app, client) -> None:
    log_in(client, app, "vic", Role.VIEWER)
    now = datetime.now(UTC)
    _shift(app, created_at=now - timedelta(hours=2), expires_at=now - timedelta(seconds=1), last_used_at=now)
    assert not _signed_in(client)
    assert _rows(app) == []


def test_last_use_is_written_at_most_once_a_minute(app, client) -> None:
    log_in(client, app, "vic", Role.VIEWER)
    (first,) = _rows(app)
    for _ in range(5):
        assert _signed_in(client)
    assert _rows(app)[0].last_used_at == first.last_used_at  # five requests within the minute: no write
    _shift(app, last_used_at=first.last_used_at - timedelta(seconds=61))
    assert _signed_in(client)
    assert _rows(app)[0].last_used_at > first.last_used_at


def test_an_admin_lists_a_users_sessions_without_their_ids_and_revokes_one(app, client) -> None:
    admin = token_for(app, "ada", Role.ADMIN)
    log_in(client, app, "vic", Role.VIEWER)
    laptop = app.test_client()
    assert laptop.post("/api/session", json={"name": "vic", "password": "a-long-password-1"},
                       headers={"User-Agent": AGENT}).status_code == 200  # fmt: skip
    listed = client.get("/api/users/vic/sessions", headers=admin)
    assert listed.status_code == 200
    sessions = listed.get_json()["sessions"]
    assert len(sessions) == 2 and {s["address"] for s in sessions} == {"127.0.0.1"}
    assert AGENT in {s["user_agent"] for s in sessions}
    cookie_ids = [app.session_interface.get_signing_serializer(app).loads(c.get_cookie("session").value)["sid"]
                  for c in (client, laptop)]  # fmt: skip
    hashes = [r.id_hash for r in _rows(app)]
    assert not any(secret in json.dumps(sessions) for secret in cookie_ids + hashes)

    laptops = [s["id"] for s in sessions if s["user_agent"] == AGENT]
    assert client.delete(f"/api/users/vic/sessions/{laptops[0]}", headers=admin).status_code == 204
    assert not _signed_in(laptop) and _signed_in(client)  # that one browser only
    assert client.delete(f"/api/users/vic/sessions/{laptops[0]}", headers=admin).status_code == 404
    assert client.get("/api/users/nobody/sessions", headers=admin).status_code == 404
    with app.extensions["flightdeck"].sessions() as db:
        events = list(db.scalars(select(AuditEvent).where(AuditEvent.action == "session.revoke")))
    assert [(e.target, e.outcome, e.detail["session"]) for e in events] == [
        ("vic", "ok", laptops[0]),
        ("vic", "error", laptops[0]),
    ]


def test_only_an_admin_sees_or_ends_someone_elses_sessions(app, client) -> None:
    operator = token_for(app, "otto", Role.OPERATOR)
    log_in(client, app, "vic", Role.VIEWER)
    (row,) = _rows(app)
    assert client.get("/api/users/vic/sessions", headers=operator).status_code == 403
    assert client.delete(f"/api/users/vic/sessions/{row.id}", headers=operator).status_code == 403
    assert _signed_in(client)
    # A session is revoked only through its own user's name: another user's number is a 404.
    admin = token_for(app, "ada", Role.ADMIN)
    assert client.delete(f"/api/users/ada/sessions/{row.id}", headers=admin).status_code == 404
    assert _signed_in(client)


def test_the_console_settings_page_lists_sessions_with_a_revoke_button(app, client) -> None:
    log_in(client, app, "vic", Role.VIEWER)
    admin_browser = app.test_client()
    log_in(admin_browser, app, "ada", Role.ADMIN)
    page = admin_browser.get("/settings").get_data(as_text=True)
    rows = {r.user_id: r.id for r in _rows(app)}
    assert len(rows) == 2
    for session_id in rows.values():
        assert f'data-session="{session_id}"' in page
        assert 'data-api="/api/users/' in page and f"/sessions/{session_id}" in page
    assert "End this session of vic?" in page
    viewer_page = client.get("/settings").get_data(as_text=True)
    assert "data-session=" not in viewer_page  # a viewer sees no one's sessions
