"""The user and audit endpoints: admin-only user management, audited changes, filtered listing."""

from __future__ import annotations

import pytest

from tests.controlplane.auth.conftest import audit_events, bearer


def test_an_admin_creates_lists_and_changes_users(app, client, accounts) -> None:
    admin = bearer(accounts["ada"])
    created = client.post(
        "/api/users", json={"name": "nina", "password": "long-enough", "role": "operator"}, headers=admin
    )
    assert created.status_code == 201
    assert created.get_json()["user"] == {
        "name": "nina",
        "role": "operator",
        "disabled": False,
        "created_at": created.get_json()["user"]["created_at"],
    }
    listed = client.get("/api/users", headers=admin).get_json()["users"]
    assert [u["name"] for u in listed] == ["ada", "nina", "otto", "vic"]
    assert all("password_hash" not in u for u in listed)
    changed = client.patch("/api/users/nina", json={"role": "viewer", "password": "another-long-one"}, headers=admin)
    assert changed.status_code == 200 and changed.get_json()["user"]["role"] == "viewer"
    assert client.post("/api/session", json={"name": "nina", "password": "another-long-one"}).status_code == 200

    create, update = [e for e in audit_events(app) if e.action.startswith("user.")]
    assert (create.action, create.actor, create.target, create.outcome) == ("user.create", "ada", "nina", "ok")
    assert create.detail["role"] == "operator" and "password" not in create.detail
    assert update.detail["role"] == {"from": "operator", "to": "viewer"} and update.detail["password_changed"] is True
    assert "another-long-one" not in str(update.detail)


def test_non_admins_cannot_manage_users(client, accounts) -> None:
    body = {"name": "eve", "password": "long-enough", "role": "admin"}
    assert client.post("/api/users", json=body, headers=bearer(accounts["otto"])).status_code == 403
    assert client.get("/api/users", headers=bearer(accounts["vic"])).status_code == 403
    assert client.patch("/api/users/otto", json={"role": "admin"}, headers=bearer(accounts["otto"])).status_code == 403


def test_failed_user_changes_are_audited_as_errors(app, client, accounts) -> None:
    admin = bearer(accounts["ada"])
    duplicate = client.post("/api/users", json={"name": "otto", "password": "long-enough"}, headers=admin)
    assert duplicate.status_code == 409
    missing = client.patch("/api/users/nobody", json={"disabled": True}, headers=admin)
    assert missing.status_code == 404
    last_admin = client.patch("/api/users/ada", json={"role": "operator"}, headers=admin)
    assert last_admin.status_code == 409 and "admin" in last_admin.get_json()["error"]["message"]
    assert client.get("/api/session", headers=admin).get_json()["role"] == "admin"  # rolled back
    events = [(e.action, e.target, e.outcome) for e in audit_events(app)]
    assert events == [
        ("user.create", "otto", "error"),
        ("user.update", "nobody", "error"),
        ("user.update", "ada", "error"),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"password": "long-enough"}, "name"),
        ({"name": "bad name!", "password": "long-enough"}, "name"),
        ({"name": "ok", "password": "short"}, "password"),
        ({"name": "ok", "password": "long-enough", "role": "root"}, "role"),
        ({"name": "ok", "password": "long-enough", "colour": "red"}, "colour"),
    ],
)
def test_bad_user_input_is_400_naming_the_field(client, accounts, body: dict, field: str) -> None:
    response = client.post("/api/users", json=body, headers=bearer(accounts["ada"]))
    assert response.status_code == 400 and f"'{field}'" in response.get_json()["error"]["message"]


def test_audit_lists_newest_first_and_filters(app, client, accounts) -> None:
    admin = bearer(accounts["ada"])
    client.post("/api/users", json={"name": "nina", "password": "long-enough"}, headers=admin)
    client.post("/api/tokens", json={"name": "bot"}, headers=bearer(accounts["otto"]))
    client.post("/api/users", json={"name": "eve", "password": "long-enough"}, headers=bearer(accounts["vic"]))

    viewer = bearer(accounts["vic"])
    events = client.get("/api/audit", headers=viewer).get_json()["events"]
    assert [(e["action"], e["actor"], e["outcome"]) for e in events] == [
        ("user.create", "vic", "denied"),
        ("token.create", "otto", "ok"),
        ("user.create", "ada", "ok"),
    ]
    assert all(e["address"] == "127.0.0.1" and e["request_id"] for e in events)
    assert [e["actor"] for e in client.get("/api/audit?actor=otto", headers=viewer).get_json()["events"]] == ["otto"]
    by_prefix = client.get("/api/audit?action=user.*", headers=viewer).get_json()["events"]
    assert [e["actor"] for e in by_prefix] == ["vic", "ada"]
    denied = client.get("/api/audit?outcome=denied", headers=viewer).get_json()["events"]
    assert [e["actor"] for e in denied] == ["vic"]
    assert len(client.get("/api/audit?limit=1", headers=viewer).get_json()["events"]) == 1
    assert client.get("/api/audit?since=-1m", headers=viewer).get_json()["events"] == events
    assert client.get("/api/audit?since=2999-01-01T00:00:00", headers=viewer).get_json()["events"] == []


@pytest.mark.parametrize(("query", "field"), [("limit=0", "limit"), ("limit=1001", "limit"), ("since=soon", "since")])
def test_bad_audit_queries_name_the_parameter(client, accounts, query: str, field: str) -> None:
    response = client.get(f"/api/audit?{query}", headers=bearer(accounts["vic"]))
    assert response.status_code == 400 and f"'{field}'" in response.get_json()["error"]["message"]


def test_the_audit_needs_a_viewer(client) -> None:
    assert client.get("/api/audit").status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body", "who"),
    [
        ("post", "/api/session", {"name": "ada", "password": "long-enough", "remember": True}, None),
        ("post", "/api/tokens", {"name": "bot", "ttl": 60}, "otto"),
        ("patch", "/api/users/otto", {"role": "viewer", "enabled": False}, "ada"),
    ],
)
def test_unknown_fields_are_refused_naming_them(app, client, accounts, method, path, body, who) -> None:
    headers = bearer(accounts[who]) if who else {}
    response = getattr(client, method)(path, json=body, headers=headers)
    (unknown,) = set(body) - {"name", "password", "role"}
    assert response.status_code == 400 and f"'{unknown}'" in response.get_json()["error"]["message"]
    assert client.get("/api/session", headers=bearer(accounts["otto"])).get_json()["role"] == "operator"


def test_a_refused_body_is_audited_as_an_error_like_any_refused_change(app, client, accounts) -> None:
    admin = bearer(accounts["ada"])
    assert client.post("/api/users", json={"name": "nina", "password": "short"}, headers=admin).status_code == 400
    assert client.patch("/api/users/otto", json={}, headers=admin).status_code == 400
    assert client.post("/api/tokens", json={"name": "bot", "ttl_s": "60"}, headers=admin).status_code == 400
    events = [(e.action, e.actor, e.target, e.outcome) for e in audit_events(app)]
    assert events == [
        ("user.create", "ada", "nina", "error"),
        ("user.update", "ada", "otto", "error"),
        ("token.create", "ada", "ada", "error"),
    ]
    assert "short" not in str([e.detail for e in audit_events(app)])


def test_a_password_is_never_echoed_in_a_refusal(client, accounts) -> None:
    for body in ({"name": "ada", "password": 123456789}, {"name": "nina", "password": ["hunter2-hunter2"]}):
        response = client.post("/api/users", json=body, headers=bearer(accounts["ada"]))
        message = response.get_json()["error"]["message"]
        assert response.status_code == 400 and "'password'" in message
        assert "123456789" not in message and "hunter2" not in message


def test_bad_audit_outcome_and_blank_filters(client, accounts) -> None:
    viewer = bearer(accounts["vic"])
    bad = client.get("/api/audit?outcome=maybe", headers=viewer)
    assert bad.status_code == 400 and "'outcome' must be ok, denied or error" in bad.get_json()["error"]["message"]
    assert client.get("/api/audit?since=&actor=&action=", headers=viewer).status_code == 200
