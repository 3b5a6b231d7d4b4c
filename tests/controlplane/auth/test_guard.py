"""require_role on views, the safety net for unguarded writes, auth_reads, and inference_auth."""

from __future__ import annotations

import numpy as np
import pytest
from flask import Blueprint, Flask, jsonify

from controlplane.auth import Role, record_event
from controlplane.auth.guard import current_actor, require_role
from controlplane.context import get_db
from tests.controlplane.auth.conftest import audit_events, bearer


def _test_blueprint() -> Blueprint:
    bp = Blueprint("guarded", __name__, url_prefix="/api/guarded")

    @bp.get("/operate")
    @require_role(Role.OPERATOR)
    def operate_get():
        return jsonify({"actor": current_actor().name})

    @bp.post("/operate")
    @require_role(Role.OPERATOR, action="thing.operate")
    def operate():
        db = get_db()
        record_event(db, current_actor(), "thing.operate", "thing", "ok", {"password": "must-not-show"})
        db.commit()
        return jsonify({"actor": current_actor().name})

    @bp.post("/unguarded")
    def unguarded():  # a write someone forgot to guard
        return jsonify({"ran": True})

    return bp


@pytest.fixture
def guarded_app(app: Flask) -> Flask:
    app.register_blueprint(_test_blueprint())
    return app


def test_anonymous_is_401_with_a_bearer_challenge(guarded_app: Flask) -> None:
    response = guarded_app.test_client().get("/api/guarded/operate")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="flightdeck"'
    error = response.get_json()["error"]
    assert error["code"] == "unauthorized" and error["request_id"] == response.headers["X-Request-ID"]


def test_a_viewer_is_403_naming_the_role_needed(guarded_app: Flask, accounts) -> None:
    client = guarded_app.test_client()
    response = client.get("/api/guarded/operate", headers=bearer(accounts["vic"]))
    assert response.status_code == 403
    assert "operator" in response.get_json()["error"]["message"]
    assert client.get("/api/guarded/operate", headers=bearer(accounts["otto"])).get_json() == {"actor": "otto"}
    assert client.get("/api/guarded/operate", headers=bearer(accounts["ada"])).status_code == 200
    assert audit_events(guarded_app) == []  # refused reads are not audited


def test_a_refused_write_is_audited_with_address_and_request_id(guarded_app: Flask, accounts) -> None:
    client = guarded_app.test_client()
    anonymous = client.post("/api/guarded/operate", headers={"X-Request-ID": "req-anon"})
    viewer = client.post(
        "/api/guarded/operate",
        headers={**bearer(accounts["vic"]), "X-Request-ID": "req-viewer"},
        environ_base={"REMOTE_ADDR": "10.1.2.3", "HTTP_X_FORWARDED_FOR": "6.6.6.6"},
    )
    assert (anonymous.status_code, viewer.status_code) == (401, 403)
    first, second = audit_events(guarded_app)
    assert (first.actor, first.action, first.outcome, first.request_id) == (
        "anonymous",
        "thing.operate",
        "denied",
        "req-anon",
    )
    assert (second.actor, second.actor_kind, second.address, second.request_id) == (
        "vic",
        "token",
        "10.1.2.3",
        "req-viewer",
    )
    assert second.target == "/api/guarded/operate" and second.detail["needed"] == "operator"
    assert second.detail["token_id"] > 0


def test_a_granted_write_records_its_event_without_secrets(guarded_app: Flask, accounts) -> None:
    response = guarded_app.test_client().post("/api/guarded/operate", headers=bearer(accounts["otto"]))
    assert response.status_code == 200
    (event,) = audit_events(guarded_app)
    assert (event.actor, event.outcome) == ("otto", "ok")
    assert event.detail["password"] == "[redacted]"


def test_a_write_nobody_guarded_still_needs_an_operator(guarded_app: Flask, accounts) -> None:
    client = guarded_app.test_client()
    assert client.post("/api/guarded/unguarded").status_code == 401
    assert client.post("/api/guarded/unguarded", headers=bearer(accounts["vic"])).status_code == 403
    assert client.post("/api/guarded/unguarded", headers=bearer(accounts["otto"])).get_json() == {"ran": True}
    assert [e.outcome for e in audit_events(guarded_app)] == ["denied", "denied"]


def test_reads_can_be_opened(client) -> None:
    assert client.get("/api/history/metrics").status_code == 200  # the tests' app_config sets auth_reads false
    assert client.get("/api/engine").status_code == 200


def test_reads_need_a_viewer_by_default() -> None:
    from controlplane.config import load_settings

    assert load_settings({}).auth_reads is True


@pytest.fixture
def reads_need_auth(app_config: dict) -> None:
    app_config["auth_reads"] = True


@pytest.mark.usefixtures("reads_need_auth")
def test_with_auth_reads_management_gets_need_a_viewer(client, accounts) -> None:
    refused = client.get("/api/history?metric=requests&start=-5m")
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert refused.get_json()["error"]["request_id"] == refused.headers["X-Request-ID"]
    granted = client.get("/api/history?metric=requests&start=-5m", headers=bearer(accounts["vic"]))
    assert granted.status_code == 200
    assert client.get("/api/openapi.json").status_code == 200
    assert client.get("/api/session").status_code == 200
    assert client.get("/v2/health/live").status_code == 200


# -- inference ----------------------------------------------------------------------------------


def _mlp_request() -> dict:
    x = np.zeros((1, 64), dtype=np.float32)
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": x.ravel().tolist()}]}


def test_inference_is_open_by_default(client) -> None:
    assert client.post("/v2/models/mlp/infer", json=_mlp_request()).status_code == 200


@pytest.fixture
def inference_needs_a_token(app_config: dict) -> None:
    app_config["inference_auth"] = True


@pytest.mark.usefixtures("inference_needs_a_token")
def test_with_inference_auth_v2_needs_a_token_of_any_role(client, accounts) -> None:
    refused = client.post("/v2/models/mlp/infer", json=_mlp_request())
    assert refused.status_code == 401
    assert set(refused.get_json()) == {"error"} and "token" in refused.get_json()["error"]
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.post("/v2/models/mlp/infer", json=_mlp_request(), headers=bearer("fd_wrong")).status_code == 401
    assert client.get("/v2/models/mlp").status_code == 401
    granted = client.post("/v2/models/mlp/infer", json=_mlp_request(), headers=bearer(accounts["vic"]))
    assert granted.status_code == 200 and granted.get_json()["model_name"] == "mlp"
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    assert audit_events(client.application) == []  # inference is not a management action
