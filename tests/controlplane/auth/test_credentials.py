"""Passwords are stored hashed; tokens are stored hashed, scoped by role, expire and can be revoked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from controlplane.auth.passwords import hash_password, verify_password
from controlplane.auth.roles import Role
from controlplane.models import ApiToken, User
from tests.controlplane.auth.conftest import PASSWORD, audit_events, bearer, make_token, make_user


def test_roles_order_by_rank_not_alphabetically() -> None:
    assert Role.VIEWER < Role.OPERATOR < Role.ADMIN
    assert Role.ADMIN >= Role.OPERATOR and not Role.VIEWER >= Role.OPERATOR
    assert min(Role.ADMIN, Role.VIEWER) is Role.VIEWER and max(Role.OPERATOR, Role.ADMIN) is Role.ADMIN


def test_a_password_is_stored_as_a_salted_scrypt_hash_only() -> None:
    first, second = hash_password("s3cret-passphrase"), hash_password("s3cret-passphrase")
    assert first.startswith("scrypt:") and "s3cret-passphrase" not in first
    assert first != second  # salted
    assert verify_password(first, "s3cret-passphrase") and not verify_password(first, "s3cret-passphrasE")


def test_the_users_table_holds_no_plaintext_password(app) -> None:
    make_user(app, "ada", Role.ADMIN)
    with app.extensions["flightdeck"].sessions() as session:
        user = session.scalar(select(User).where(User.name == "ada"))
    assert PASSWORD not in user.password_hash and verify_password(user.password_hash, PASSWORD)


def test_a_token_is_stored_as_its_hash_with_a_short_display_prefix(app, accounts) -> None:
    secret = accounts["otto"]
    assert secret.startswith("fd_") and len(secret) > 40
    with app.extensions["flightdeck"].sessions() as session:
        stored = [t for t in session.scalars(select(ApiToken)) if t.prefix == secret[:8]]
    assert len(stored) == 1
    assert stored[0].token_hash != secret and secret not in stored[0].token_hash and len(stored[0].token_hash) == 64


def test_token_lifecycle_create_use_revoke(app, client, accounts) -> None:
    created = client.post(
        "/api/tokens", json={"name": "deploy-bot", "role": "operator"}, headers=bearer(accounts["otto"])
    )
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    secret, token_id = body["secret"], body["token"]["id"]
    assert created.headers["Cache-Control"] == "no-store"
    assert body["token"]["prefix"] == secret[:8] and body["token"]["role"] == "operator"

    assert client.get("/api/session", headers=bearer(secret)).get_json()["user"] == "otto"
    assert client.get("/api/tokens", headers=bearer(secret)).status_code == 200
    listed = client.get("/api/tokens", headers=bearer(secret)).get_json()["tokens"]
    assert all("secret" not in t and "token_hash" not in t for t in listed)
    assert next(t for t in listed if t["id"] == token_id)["last_used_at"] is not None

    assert client.delete(f"/api/tokens/{token_id}", headers=bearer(secret)).status_code == 200
    refused = client.get("/api/tokens", headers=bearer(secret))
    assert refused.status_code == 401
    assert 'error="invalid_token"' in refused.headers["WWW-Authenticate"]
    assert refused.get_json()["error"]["code"] == "unauthorized"

    actions = [(e.action, e.outcome) for e in audit_events(app)]
    assert ("token.create", "ok") in actions and ("token.revoke", "ok") in actions
    assert all(secret not in str(e.detail) for e in audit_events(app))


def test_an_expired_token_is_refused(app, client, accounts) -> None:
    past = datetime.now(UTC) - timedelta(hours=2)
    expired = make_token(app, "otto", Role.OPERATOR, ttl_s=3600, now=past)
    live = make_token(app, "otto", Role.OPERATOR, ttl_s=3600)
    assert client.get("/api/tokens", headers=bearer(expired)).status_code == 401
    assert client.get("/api/tokens", headers=bearer(live)).status_code == 200


@pytest.mark.parametrize("header", ["Bearer fd_not-a-real-token", "Bearer ", "Basic YWRhOnB3", "fd_nothing"])
def test_malformed_or_unknown_credentials_are_401(client, accounts, header: str) -> None:
    response = client.get("/api/tokens", headers={"Authorization": header})
    assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")


def test_an_operator_token_of_an_admin_cannot_do_admin_things(app, client, accounts) -> None:
    narrow = make_token(app, "ada", Role.OPERATOR)
    assert client.get("/api/users", headers=bearer(accounts["ada"])).status_code == 200
    refused = client.get("/api/users", headers=bearer(narrow))
    assert refused.status_code == 403 and "admin" in refused.get_json()["error"]["message"]


def test_a_token_cannot_exceed_its_users_role(app, client, accounts) -> None:
    response = client.post("/api/tokens", json={"name": "sneaky", "role": "admin"}, headers=bearer(accounts["otto"]))
    assert response.status_code == 403 and "admin" in response.get_json()["error"]["message"]
    # Nor can a narrow token mint a wider one for its (admin) user.
    narrow = make_token(app, "ada", Role.VIEWER)
    response = client.post("/api/tokens", json={"name": "wider", "role": "operator"}, headers=bearer(narrow))
    assert response.status_code == 403
    denied = [e for e in audit_events(app) if e.action == "token.create"]
    assert [e.outcome for e in denied] == ["denied", "denied"]


def test_demoting_a_user_narrows_their_existing_tokens_and_disabling_stops_them(app, client, accounts) -> None:
    admin = bearer(accounts["ada"])
    otto = accounts["otto"]
    assert client.patch("/api/users/otto", json={"role": "viewer"}, headers=admin).status_code == 200
    assert client.get("/api/session", headers=bearer(otto)).get_json()["role"] == "viewer"
    assert client.patch("/api/users/otto", json={"disabled": True}, headers=admin).status_code == 200
    assert client.get("/api/tokens", headers=bearer(otto)).status_code == 401


def test_only_the_owner_or_an_admin_revokes_a_token(app, client, accounts) -> None:
    created = client.post("/api/tokens", json={"name": "mine"}, headers=bearer(accounts["otto"])).get_json()
    token_id = created["token"]["id"]
    other = client.delete(f"/api/tokens/{token_id}", headers=bearer(accounts["vic"]))
    assert other.status_code == 403
    assert client.delete("/api/tokens/99999", headers=bearer(accounts["ada"])).status_code == 404
    assert client.delete(f"/api/tokens/{token_id}", headers=bearer(accounts["ada"])).status_code == 200
    outcomes = [(e.actor, e.outcome) for e in audit_events(app) if e.action == "token.revoke"]
    assert outcomes == [("vic", "denied"), ("ada", "error"), ("ada", "ok")]


@pytest.mark.parametrize(
    ("body", "field"),
    [({"role": "operator"}, "name"), ({"name": "x", "role": "root"}, "role"), ({"name": "x", "ttl_s": 0}, "ttl_s")],
)
def test_bad_token_requests_name_the_field(client, accounts, body: dict, field: str) -> None:
    response = client.post("/api/tokens", json=body, headers=bearer(accounts["otto"]))
    assert response.status_code == 400 and f"'{field}'" in response.get_json()["error"]["message"]


def token_row(app, token_id: int) -> ApiToken:
    with app.extensions["flightdeck"].sessions() as session:
        return session.get(ApiToken, token_id)


def test_a_token_made_with_a_token_never_outlives_its_parent(app, client, accounts) -> None:
    parent = make_token(app, "otto", Role.OPERATOR, ttl_s=3600, now=datetime.now(UTC) - timedelta(seconds=3540))
    parent_row = client.get("/api/session", headers=bearer(parent)).get_json()
    unlimited = client.post("/api/tokens", json={"name": "forever"}, headers=bearer(parent))
    longer = client.post("/api/tokens", json={"name": "longer", "ttl_s": 86400}, headers=bearer(parent))
    shorter = client.post("/api/tokens", json={"name": "shorter", "ttl_s": 1}, headers=bearer(parent))
    assert {r.status_code for r in (unlimited, longer, shorter)} == {201}
    parent_expiry = token_row(app, parent_row["token_id"]).expires_at
    for child in (unlimited, longer):  # the parent has about a minute left: so do they
        assert token_row(app, child.get_json()["token"]["id"]).expires_at == parent_expiry
    assert token_row(app, shorter.get_json()["token"]["id"]).expires_at < parent_expiry  # a shorter ttl still wins

    from controlplane.auth.tokens import find_token

    with app.extensions["flightdeck"].sessions() as session:
        assert find_token(session, unlimited.get_json()["secret"], parent_expiry - timedelta(seconds=1)) is not None
        assert find_token(session, unlimited.get_json()["secret"], parent_expiry) is None


def test_revoking_a_token_revokes_every_token_made_with_it(app, client, accounts) -> None:
    parent = client.post("/api/tokens", json={"name": "runbook-7"}, headers=bearer(accounts["otto"])).get_json()
    child = client.post("/api/tokens", json={"name": "child"}, headers=bearer(parent["secret"])).get_json()
    grandchild = client.post("/api/tokens", json={"name": "grandchild"}, headers=bearer(child["secret"])).get_json()
    sibling = client.post("/api/tokens", json={"name": "unrelated"}, headers=bearer(accounts["otto"])).get_json()
    assert token_row(app, grandchild["token"]["id"]).parent_id == child["token"]["id"]
    revoked = client.delete(f"/api/tokens/{parent['token']['id']}", headers=bearer(accounts["otto"]))
    assert revoked.status_code == 200
    for made in (parent, child, grandchild):
        assert client.get("/api/session", headers=bearer(made["secret"])).get_json()["authenticated"] is False
    assert client.get("/api/session", headers=bearer(sibling["secret"])).get_json()["user"] == "otto"


def test_a_runbook_runs_token_takes_what_it_made_with_it_when_the_run_ends(app, accounts) -> None:
    from controlplane.auth.tokens import create_token, find_token, revoke_token

    now = datetime.now(UTC)
    with app.extensions["flightdeck"].sessions() as session:
        otto = session.scalar(select(User).where(User.name == "otto"))
        run_token, _ = create_token(session, otto, "runbook-1", Role.OPERATOR, now, ttl_s=120)
        made, made_secret = create_token(session, otto, "made-by-script", Role.VIEWER, now, None, parent=run_token)
        assert made.expires_at == run_token.expires_at and made.parent_id == run_token.id
        with pytest.raises(Exception, match="above"):
            create_token(session, otto, "wider", Role.ADMIN, now, None, parent=made)
        revoke_token(session, run_token, now)  # what the runner does when the run finishes or is lost
        session.commit()
        assert find_token(session, made_secret, now) is None
