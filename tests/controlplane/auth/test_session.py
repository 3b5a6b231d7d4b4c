"""Logging in with the session cookie, CSRF on cookie writes, and slowing down password guessing."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.auth import users
from controlplane.auth.roles import Role
from controlplane.models import LoginFailure
from tests.controlplane.auth.conftest import PASSWORD, audit_events, login, make_user


def test_login_sets_a_session_that_says_who_you_are(app, client) -> None:
    make_user(app, "otto", Role.OPERATOR)
    assert client.get("/api/session").get_json()["authenticated"] is False
    response = client.post("/api/session", json={"name": "otto", "password": PASSWORD})
    assert response.status_code == 200
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    csrf = response.get_json()["csrf_token"]
    me = client.get("/api/session").get_json()
    assert me == {
        "authenticated": True,
        "user": "otto",
        "role": "operator",
        "kind": "session",
        "token_id": None,
        "csrf_token": csrf,
    }
    (event,) = [e for e in audit_events(app) if e.action == "auth.login"]
    assert (event.actor, event.actor_kind, event.outcome, event.address) == ("otto", "user", "ok", "127.0.0.1")


def test_a_cookie_write_without_the_csrf_header_is_403_and_with_it_goes_through(app, client) -> None:
    make_user(app, "otto", Role.OPERATOR)
    csrf = login(client, "otto")
    refused = client.post("/api/tokens", json={"name": "bot"})
    assert refused.status_code == 403 and "X-CSRF-Token" in refused.get_json()["error"]["message"]
    wrong = client.post("/api/tokens", json={"name": "bot"}, headers={"X-CSRF-Token": "guess"})
    assert wrong.status_code == 403
    accepted = client.post("/api/tokens", json={"name": "bot"}, headers={"X-CSRF-Token": csrf})
    assert accepted.status_code == 201
    outcomes = [e.outcome for e in audit_events(app) if e.action == "token.create"]
    assert outcomes == ["denied", "denied", "ok"]


def test_logout_needs_the_csrf_token_and_ends_the_session(app, client) -> None:
    make_user(app, "vic", Role.VIEWER)
    csrf = login(client, "vic")
    assert client.delete("/api/session").status_code == 403
    assert client.get("/api/session").get_json()["authenticated"] is True
    assert client.delete("/api/session", headers={"X-CSRF-Token": csrf}).status_code == 204
    assert client.get("/api/session").get_json()["authenticated"] is False
    assert client.get("/api/tokens").status_code == 401


def test_changing_a_password_ends_existing_sessions(app, client) -> None:
    make_user(app, "ada", Role.ADMIN)
    make_user(app, "vic", Role.VIEWER)
    victim = app.test_client()
    login(victim, "vic")
    csrf = login(client, "ada")
    changed = client.patch("/api/users/vic", json={"password": "a-brand-new-one"}, headers={"X-CSRF-Token": csrf})
    assert changed.status_code == 200
    assert victim.get("/api/session").get_json()["authenticated"] is False
    login(victim, "vic", "a-brand-new-one")


def test_wrong_password_unknown_user_and_disabled_user_all_look_the_same(app, client) -> None:
    make_user(app, "ada", Role.ADMIN)
    make_user(app, "gone", Role.VIEWER)
    with app.extensions["flightdeck"].sessions() as session:
        users.update_user(session, users.get_user(session, "gone"), disabled=True)
        session.commit()
    answers = [
        client.post("/api/session", json={"name": name, "password": password})
        for name, password in (("ada", "not-it-at-all"), ("nobody", PASSWORD), ("gone", PASSWORD))
    ]
    assert {a.status_code for a in answers} == {401}
    assert {a.get_json()["error"]["message"] for a in answers} == {"wrong name or password"}
    denied = [e for e in audit_events(app) if e.action == "auth.login"]
    # A viewer of the trail cannot tell a wrong password from an unknown name by the reason.
    assert [(e.target, e.outcome, e.detail["reason"]) for e in denied] == [
        ("ada", "denied", "bad_credentials"),
        ("unknown name", "denied", "bad_credentials"),
        ("gone", "denied", "disabled"),
    ]
    assert all(e.actor == "anonymous" for e in denied)
    assert all(PASSWORD not in str(e.detail) and "not-it-at-all" not in str(e.detail) for e in denied)


def test_repeated_failures_lock_the_name_out_for_a_doubling_while(app, client, clock) -> None:
    make_user(app, "ada", Role.ADMIN)
    for _ in range(3):  # the fake throttle allows 3 failures, then 10 s, doubling
        assert client.post("/api/session", json={"name": "ada", "password": "guess-guess"}).status_code == 401
    locked = client.post("/api/session", json={"name": "ada", "password": PASSWORD})
    assert locked.status_code == 429 and locked.headers["Retry-After"] == "10"
    assert locked.get_json()["error"]["code"] == "too_many_requests"

    clock.advance(10)
    assert client.post("/api/session", json={"name": "ada", "password": "guess-again"}).status_code == 401
    assert client.post("/api/session", json={"name": "ada", "password": PASSWORD}).headers["Retry-After"] == "20"

    clock.advance(20)
    login(client, "ada")  # a success forgets the failures
    assert client.post("/api/session", json={"name": "ada", "password": "one-more-miss"}).status_code == 401

    logins = [e for e in audit_events(app) if e.action == "auth.login"]
    reasons = [e.detail.get("reason", e.outcome) for e in logins]
    assert reasons == [
        "bad_credentials",
        "bad_credentials",
        "bad_credentials",
        "throttled",
        "bad_credentials",
        "throttled",
        "ok",
        "bad_credentials",
    ]
    assert logins[2].detail["locked_for_s"] == 10
    assert all(e.outcome == "denied" for e in logins if e.detail.get("reason"))


def test_the_lockout_is_per_name_and_address(app, client, clock) -> None:
    make_user(app, "ada", Role.ADMIN)
    make_user(app, "vic", Role.VIEWER)
    for _ in range(3):
        client.post("/api/session", json={"name": "ada", "password": "guess-guess"})
    assert client.post("/api/session", json={"name": "ada", "password": PASSWORD}).status_code == 429
    elsewhere = app.test_client()
    other_address = {"REMOTE_ADDR": "10.0.0.9"}
    response = elsewhere.post("/api/session", json={"name": "ada", "password": PASSWORD}, environ_base=other_address)
    assert response.status_code == 200
    login(app.test_client(), "vic")


def test_login_input_is_checked(client) -> None:
    assert "'name'" in client.post("/api/session", json={"password": "x"}).get_json()["error"]["message"]
    assert "'password'" in client.post("/api/session", json={"name": "x"}).get_json()["error"]["message"]
    assert client.post("/api/session", data="not json", content_type="application/json").status_code == 400


def test_the_lockout_holds_in_every_process_sharing_the_database(app_config) -> None:
    from controlplane.app import create_app

    config = app_config | {"login_max_failures": 2, "login_lockout_s": 60}
    first, second = create_app(config), create_app(config)  # two workers (or nodes) over one database
    try:
        make_user(first, "ada", Role.ADMIN)
        for _ in range(2):
            assert (
                first.test_client().post("/api/session", json={"name": "ada", "password": "guess"}).status_code == 401
            )
        refused = second.test_client().post("/api/session", json={"name": "ada", "password": PASSWORD})
        assert refused.status_code == 429 and 0 < int(refused.headers["Retry-After"]) <= 60
        with first.extensions["flightdeck"].sessions() as db:
            stored = db.scalars(select(LoginFailure)).all()
        assert [row.failures for row in stored] == [2]
        assert "ada" not in stored[0].key_hash  # a digest: what was typed as a name is not kept
    finally:
        first.extensions["flightdeck"].shutdown(5)
        second.extensions["flightdeck"].shutdown(5)


def test_a_failed_login_keeps_an_unknown_name_only_as_a_keyed_hash(app, client, clock) -> None:
    make_user(app, "ada", Role.ADMIN)
    typed = "Tr0ub4dor&3-my-password"  # a password typed into the name field
    for _ in range(4):  # three failures, then the throttle refuses
        client.post("/api/session", json={"name": typed, "password": "whatever-it-is"})
    client.post("/api/session", json={"name": "someone-else", "password": "whatever-it-is"})
    client.post("/api/session", json={"name": "system", "password": "!"})
    logins = [e for e in audit_events(app) if e.action == "auth.login"]
    assert all(typed not in f"{e.target}{e.detail}{e.actor}" for e in logins)
    assert [(e.target, e.detail["reason"]) for e in logins] == [
        ("unknown name", "bad_credentials"),
        ("unknown name", "bad_credentials"),
        ("unknown name", "bad_credentials"),
        ("unknown name", "throttled"),
        ("unknown name", "bad_credentials"),
        ("unknown name", "bad_credentials"),  # the reserved `system` is no account one can log in to
    ]
    hashes = [e.detail["name_hash"] for e in logins]
    assert len(set(hashes[:4])) == 1 and hashes[4] != hashes[0]  # one typed name correlates, others differ
    assert typed.casefold() not in hashes[0] and len(hashes[0]) == 16
    assert logins[2].detail["locked_for_s"] == 10  # the throttle still counts per name and address
