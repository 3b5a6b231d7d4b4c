"""Server-side sessions: logout ends the cookie everywhere, forged cookies fail, `system` never logs in."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from controlplane.auth import login_sessions, users
from controlplane.auth.passwords import hash_password
from controlplane.auth.roles import Role
from controlplane.models import LoginSession, User
from tests.controlplane.auth.conftest import PASSWORD, audit_events, login, make_user

COOKIE = "session"


def cookie_of(client: FlaskClient) -> str:
    cookie = client.get_cookie(COOKIE)
    assert cookie is not None
    return cookie.value


def replay(app: Flask, value: str) -> FlaskClient:
    """Return a new client (another browser, an attacker) holding a copy of a session cookie."""
    other = app.test_client()
    other.set_cookie(COOKIE, value)
    return other


def signed(app: Flask, data: dict) -> str:
    """Sign a cookie with the app's own secret, as someone who knows the secret could."""
    serializer = app.session_interface.get_signing_serializer(app)
    assert serializer is not None
    return serializer.dumps(data)


def add_system_account(app: Flask, password_hash: str) -> int:
    """Create the `system` account the way the runbook runner does on an automatic run."""
    with app.extensions["flightdeck"].sessions() as db:
        user = User(name="system", password_hash=password_hash, role="operator", created_at=datetime.now(UTC))
        db.add(user)
        db.commit()
        return user.id


def test_logout_ends_the_session_for_every_copy_of_the_cookie(app, client) -> None:
    make_user(app, "vic", Role.VIEWER)
    csrf = login(client, "vic")
    stolen = cookie_of(client)
    assert replay(app, stolen).get("/api/session").get_json()["authenticated"] is True
    assert client.delete("/api/session", headers={"X-CSRF-Token": csrf}).status_code == 204
    copy = replay(app, stolen)
    assert copy.get("/api/session").get_json()["authenticated"] is False
    assert copy.get("/api/tokens").status_code == 401
    with app.extensions["flightdeck"].sessions() as db:
        assert db.scalars(select(LoginSession)).all() == []


def test_the_console_logout_ends_the_session_too(app, client) -> None:
    make_user(app, "vic", Role.VIEWER)
    csrf = login(client, "vic")
    stolen = cookie_of(client)
    out = client.post("/logout", data={"csrf_token": csrf})
    assert out.status_code == 302
    assert replay(app, stolen).get("/api/session").get_json()["authenticated"] is False


def test_the_cookie_holds_a_random_id_and_the_database_only_its_hash(app, client) -> None:
    make_user(app, "vic", Role.VIEWER)
    login(client, "vic")
    data = app.session_interface.get_signing_serializer(app).loads(cookie_of(client))
    assert set(data) == {"sid", "csrf"} and len(data["sid"]) >= 43
    with app.extensions["flightdeck"].sessions() as db:
        (row,) = db.scalars(select(LoginSession)).all()
        hashed = users.get_user(db, "vic").password_hash
    assert row.id_hash == hashlib.sha256(data["sid"].encode()).hexdigest() and data["sid"] not in row.id_hash
    assert not any(
        hashed in str(v) or hashlib.sha256(hashed.encode()).hexdigest()[:16] in str(v) for v in data.values()
    )


def test_a_cookie_derived_from_a_password_hash_is_refused_even_with_the_secret(app) -> None:
    make_user(app, "ada", Role.ADMIN)
    with app.extensions["flightdeck"].sessions() as db:
        ada = users.get_user(db, "ada")
    # The old cookie: the user id and a digest of the stored hash, which anyone reading the database had.
    forged = signed(
        app,
        {"uid": ada.id, "key": hashlib.sha256(ada.password_hash.encode()).hexdigest()[:16], "csrf": "c", "sid": "x"},
    )
    attacker = replay(app, forged)
    assert attacker.get("/api/session").get_json()["authenticated"] is False
    assert attacker.post("/api/tokens", json={"name": "mine"}, headers={"X-CSRF-Token": "c"}).status_code == 401


@pytest.mark.parametrize("stored", ["!", "known-password"])
def test_the_system_account_can_neither_log_in_nor_hold_a_session(app, client, stored) -> None:
    password = stored
    system_id = add_system_account(app, stored if stored == "!" else hash_password(stored))
    for typed in (password, "!", ""):
        refused = client.post("/api/session", json={"name": "system", "password": typed or "x"})
        assert refused.status_code == 401
    forged = signed(app, {"uid": system_id, "key": hashlib.sha256(b"!").hexdigest()[:16], "csrf": "c"})
    attacker = replay(app, forged)
    assert attacker.get("/api/session").get_json()["authenticated"] is False
    assert attacker.post("/api/silences", json={}, headers={"X-CSRF-Token": "c"}).status_code == 401
    with app.extensions["flightdeck"].sessions() as db:
        system = db.get(User, system_id)
        with pytest.raises(ValueError, match="cannot hold a session"):
            login_sessions.open_session(db, system, datetime.now(UTC), timedelta(hours=1))
        # Even a row someone managed to write does not make it a login.
        db.add(
            LoginSession(
                user_id=system_id,
                id_hash=hashlib.sha256(b"planted").hexdigest(),
                created_at=datetime.now(UTC),
                expires_at=datetime.now(UTC) + timedelta(hours=1),
            )
        )
        db.commit()
    assert (
        replay(app, signed(app, {"sid": "planted", "csrf": "c"})).get("/api/session").get_json()["authenticated"]
        is False
    )


@pytest.mark.parametrize("change", [{"role": "viewer"}, {"disabled": True}, {"password": "a-brand-new-one"}])
def test_a_role_change_password_change_or_disable_ends_the_users_sessions(app, client, change) -> None:
    make_user(app, "ada", Role.ADMIN)
    make_user(app, "otto", Role.OPERATOR)
    victim = app.test_client()
    login(victim, "otto")
    csrf = login(client, "ada")
    assert client.patch("/api/users/otto", json=change, headers={"X-CSRF-Token": csrf}).status_code == 200
    assert victim.get("/api/session").get_json()["authenticated"] is False
    (update,) = [e for e in audit_events(app) if e.action == "user.update"]
    assert update.detail["sessions_ended"] == 1
    assert client.get("/api/session").get_json()["user"] == "ada"  # the admin's own session is untouched


def test_a_session_ends_at_its_absolute_expiry(app) -> None:
    make_user(app, "vic", Role.VIEWER)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with app.extensions["flightdeck"].sessions() as db:
        vic = users.get_user(db, "vic")
        session_id = login_sessions.open_session(db, vic, start, timedelta(hours=12))
        db.commit()
        assert login_sessions.find_session(db, session_id, start + timedelta(hours=11, minutes=59)).name == "vic"
        assert login_sessions.find_session(db, session_id, start + timedelta(hours=12)) is None
        assert login_sessions.find_session(db, session_id + "x", start) is None
        # The next login of the same user clears the expired row away.
        login_sessions.open_session(db, vic, start + timedelta(days=1), timedelta(hours=12))
        db.commit()
        assert login_sessions.count_sessions(db, vic.id, start + timedelta(days=1)) == 1
        assert len(db.scalars(select(LoginSession)).all()) == 1


def test_a_cookie_signed_by_one_worker_is_read_by_another_over_the_same_home(app_config) -> None:
    from controlplane.app import create_app

    first, second = create_app(app_config), create_app(app_config)  # two workers, no secret configured
    try:
        assert first.secret_key == second.secret_key and len(first.secret_key) >= 32
        make_user(first, "vic", Role.VIEWER)
        browser = first.test_client()
        login(browser, "vic", PASSWORD)
        assert replay(second, cookie_of(browser)).get("/api/session").get_json()["user"] == "vic"
    finally:
        first.extensions["flightdeck"].shutdown(5)
        second.extensions["flightdeck"].shutdown(5)
