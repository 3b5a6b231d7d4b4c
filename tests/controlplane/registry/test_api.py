"""The registry API over the Flask test client: multipart push, reads, tags, delete, refusals, size cap."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from controlplane.auth import Role, tokens, users
from controlplane.models import AuditEvent
from controlplane.registry import api as registry_api
from tests.controlplane.registry.conftest import add_manifest, assert_nothing_kept, good_members, make_tar, member


@pytest.fixture(autouse=True)
def one_small_model(app_config: dict) -> None:
    """Serve only the MLP at the shortest bucket: these tests need a server, not models."""
    app_config.update(load_models="mlp", warmup_max_sequence=16, max_archive_bytes=128 * 1024)


@pytest.fixture
def app(app_config: dict, shared_sessions: None) -> Iterator[Flask]:
    """The app, with the registry blueprint registered even where create_app does not register it yet."""
    from controlplane.app import create_app

    application = create_app(app_config)
    if "registry" not in application.blueprints:
        application.register_blueprint(registry_api.bp)
    application.testing = True
    yield application
    application.extensions["flightdeck"].shutdown(5)


def token_for(app: Flask, role: Role) -> dict[str, str]:
    with app.extensions["flightdeck"].sessions() as session:
        user = users.create_user(session, f"user-{role}", "correct horse battery", role, datetime.now(UTC))
        session.flush()
        _, secret = tokens.create_token(session, user, "test", role, datetime.now(UTC), None)
        session.commit()
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def operator(app: Flask) -> dict[str, str]:
    return token_for(app, Role.OPERATOR)


def upload(client: FlaskClient, data: bytes, headers: dict[str, str], **form: str):
    return client.post(
        "/api/models",
        data={"archive": (io.BytesIO(data), "m.tar.gz"), **form},
        headers=headers,
        content_type="multipart/form-data",
    )


def events(app: Flask) -> list[tuple[str, str, str, str]]:
    with app.extensions["flightdeck"].sessions() as session:
        rows = session.scalars(select(AuditEvent).order_by(AuditEvent.id))
        return [(e.actor, e.action, e.target, e.outcome) for e in rows]


def test_push_show_list_tag_delete(app: Flask, client: FlaskClient, operator: dict, home: Path) -> None:
    data = make_tar(good_members())
    sha = hashlib.sha256(data).hexdigest()
    created = upload(client, data, operator, sha256=sha)
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    assert (body["name"], body["version"], body["sha256"], body["size_bytes"]) == ("adder", "1", sha, len(data))
    assert body["pushed_by"] == "user-operator" and body["golden"] == {"samples": 1, "passed": True}
    assert created.headers["Location"] == "/api/models/adder/versions/1"
    assert upload(client, data, operator).status_code == 200  # the same archive again

    shown = client.get("/api/models/adder/versions/1").get_json()
    assert shown["manifest"] == add_manifest() and shown["tags"] == []
    listed = client.get("/api/models").get_json()
    assert [(m["name"], [v["version"] for v in m["versions"]]) for m in listed["models"]] == [("adder", ["1"])]
    assert [v["sha256"] for v in client.get("/api/models/adder/versions").get_json()["versions"]] == [sha]

    tagged = client.put("/api/models/adder/versions/1/tags", json=["stable"], headers=operator)
    assert tagged.status_code == 200 and tagged.get_json()["tags"] == ["stable"]
    assert client.put("/api/models/adder/versions/1/tags", json={"tags": []}, headers=operator).status_code == 400

    assert client.delete("/api/models/adder/versions/1", headers=operator).status_code == 204
    gone = client.get("/api/models/adder/versions/1")
    assert gone.status_code == 404 and gone.get_json()["error"]["code"] == "not_found"
    assert client.get("/api/models/adder/versions").status_code == 404
    assert_nothing_kept(home, app.extensions["flightdeck"].sessions)
    assert [e[1:] for e in events(app)] == [
        ("model.push", "adder/1", "ok"),
        ("model.push", "adder/1", "ok"),
        ("model.tag", "adder/1", "ok"),
        ("model.delete", "adder/1", "ok"),
    ]


def test_a_bad_archive_is_400_in_the_envelope_and_audited(
    app: Flask, client: FlaskClient, operator: dict, home: Path
) -> None:
    data = make_tar([*good_members(), member("../escape", b"x")])
    refused = upload(client, data, operator)
    assert refused.status_code == 400
    error = refused.get_json()["error"]
    assert error["code"] == "invalid_archive" and "path traversal" in error["message"] and error["request_id"]
    assert_nothing_kept(home, app.extensions["flightdeck"].sessions)
    assert events(app) == [("user-operator", "model.push", "", "error")]


def test_wrong_hash_and_conflict(app: Flask, client: FlaskClient, operator: dict) -> None:
    data = make_tar(good_members())
    wrong = upload(client, data, operator, sha256="0" * 64)
    assert wrong.status_code == 400 and wrong.get_json()["error"]["code"] == "sha256_mismatch"
    assert upload(client, data, operator).status_code == 201
    other = make_tar(good_members(manifest=add_manifest(description="another build")))
    conflict = upload(client, other, operator)
    assert conflict.status_code == 409
    assert hashlib.sha256(other).hexdigest() in conflict.get_json()["error"]["message"]


def test_missing_field_and_size_cap(app: Flask, client: FlaskClient, operator: dict, home: Path) -> None:
    missing = client.post("/api/models", data={"file": (io.BytesIO(b"x"), "m.tar.gz")}, headers=operator)
    assert missing.status_code == 400 and "'archive'" in missing.get_json()["error"]["message"]
    limit = app.extensions["flightdeck"].settings.max_archive_bytes
    # NOTE: kept under 500 KiB, where the test client would spool the body to a file it never closes.
    over_body = upload(client, bytes(limit + registry_api.FORM_OVERHEAD_BYTES + 1), operator)
    assert over_body.status_code == 413 and over_body.get_json()["error"]["code"] == "request_entity_too_large"
    over_archive = upload(client, bytes(limit + 1), operator)
    assert over_archive.status_code == 413
    assert over_archive.get_json()["error"]["code"] == "archive_too_large"
    assert_nothing_kept(home, app.extensions["flightdeck"].sessions)


def test_changes_need_an_operator(app: Flask, client: FlaskClient, home: Path) -> None:
    data = make_tar(good_members())
    assert upload(client, data, {}).status_code == 401
    viewer = token_for(app, Role.VIEWER)
    assert upload(client, data, viewer).status_code == 403
    assert client.delete("/api/models/adder/versions/1", headers=viewer).status_code == 403
    assert client.put("/api/models/adder/versions/1/tags", json=[], headers=viewer).status_code == 403
    assert_nothing_kept(home, app.extensions["flightdeck"].sessions)
    assert client.get("/api/models").get_json() == {"models": []}
