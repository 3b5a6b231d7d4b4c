"""Triton's model repository extension: tritonclient against a real two-worker server, and the Flask client."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from tritonclient.utils import InferenceServerException

from bench.rollout import operator_token
from controlplane.auth import Role
from controlplane.models import AuditEvent
from tests.conftest import copy_home
from tests.controlplane.conftest import token_for
from tests.controlplane.registry.conftest import WEIGHTS, add_manifest, add_model, good_members, make_tar
from tests.servers import Server, start_server, wait_until
from tests.tritonhttp import Client

ADDER = make_tar(good_members(add_model(), add_manifest()))


def adder_input(x: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


@pytest.fixture(scope="module")
def repository_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator[Server]:
    """Two workers, each with its own engine: a load and an unload must reach both."""
    home = copy_home(template_home, tmp_path_factory.mktemp("repository") / "home")
    server = start_server(
        home,
        env={"FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_LOAD_MODELS": "mlp,adder", "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16"},
    )
    server.token = operator_token(home)
    yield server
    assert server.stop() == 0


def ready_everywhere(server: Server, name: str, tries: int = 12) -> set[int]:
    """Ask readiness over fresh connections (each may land on either worker); return the statuses seen."""
    return {requests.get(f"{server.url}/v2/models/{name}/ready", timeout=10).status_code for _ in range(tries)}


@pytest.mark.slow
def test_tritonclient_index_load_and_unload_drive_the_served_set(repository_server: Server) -> None:
    server = repository_server
    auth = {"Authorization": f"Bearer {server.token}"}
    triton = Client(url=server.url.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException, match="authentication required") as anonymous:
            triton.get_model_repository_index()
        assert anonymous.value.status() == "401"
        pushed = requests.post(f"{server.url}/api/models", files={"archive": ("a.tar.gz", ADDER)}, headers=auth)
        assert pushed.status_code == 201, pushed.text
        index = {e["name"]: e for e in triton.get_model_repository_index(headers=auth)}
        assert index["adder"] == {"name": "adder", "state": "UNAVAILABLE", "reason": "not deployed"}
        assert index["mlp"] == {"name": "mlp", "version": "1", "state": "READY", "reason": ""}
        assert index["textcls"]["state"] == "UNAVAILABLE" and "FLIGHTDECK_LOAD_MODELS" in index["textcls"]["reason"]

        triton.load_model("adder", headers=auth)  # returns once the worker that answered serves it
        assert triton.is_model_ready("adder")
        deployment = requests.get(f"{server.url}/api/models/adder/deployment", headers=auth).json()
        assert deployment["slots"]["blue"] == {"version": "1", "weight": 100}
        wait_until(lambda: ready_everywhere(server, "adder") == {200}, 30, "adder ready in both workers")

        def loaded_in() -> set[str]:
            processes = requests.get(f"{server.url}/api/models/adder/deployment", headers=auth).json()["processes"]
            return {p["process"] for p in processes if p["slot"] == "blue" and p["state"] == "loaded"}

        # NOTE: a worker reports its slot after it starts serving it; sampled readiness can see it first.
        wait_until(lambda: len(loaded_in()) == 2, 30, "both workers report adder loaded")
        x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32)
        for _ in range(6):
            result = triton.infer("adder", [adder_input(x)])
            np.testing.assert_allclose(result.as_numpy("y"), x + WEIGHTS, rtol=1e-6)
        ready = requests.post(f"{server.url}/v2/repository/index", json={"ready": True}, headers=auth)
        assert {e["name"] for e in ready.json()} == {"adder", "mlp"}

        triton.load_model("adder", headers=auth)  # loading a served model again changes nothing
        with pytest.raises(InferenceServerException, match="config or file override") as override:
            triton.load_model("adder", headers=auth, config='{"max_batch_size": 4}')
        assert override.value.status() == "400"
        with pytest.raises(InferenceServerException, match="not in the registry") as unknown:
            triton.load_model("nobody", headers=auth)
        assert unknown.value.status() == "404"

        triton.unload_model("adder", headers=auth)
        assert not triton.is_model_ready("adder")
        wait_until(lambda: ready_everywhere(server, "adder") <= {400, 404}, 30, "adder unloaded in both workers")
        assert ready_everywhere(server, "mlp") == {200}
        index = {e["name"]: e for e in triton.get_model_repository_index(headers=auth)}
        assert index["adder"]["state"] == "UNAVAILABLE" and index["adder"]["reason"] == "not deployed"
        triton.unload_model("adder", headers=auth)  # unloading what is not loaded is not an error
    finally:
        triton.close()


@pytest.fixture
def flask_app(app_config: dict) -> Iterator[Flask]:
    from controlplane.app import create_app

    application = create_app(app_config | {"load_models": "mlp,adder", "log_sample_rate": 0.0})
    yield application
    application.extensions["flightdeck"].shutdown(5)


def test_repository_calls_need_an_operator_and_are_audited_like_deploys(flask_app: Flask) -> None:
    client: FlaskClient = flask_app.test_client()
    viewer = token_for(flask_app, "vic", Role.VIEWER)
    operator = token_for(flask_app, "otto", Role.OPERATOR)
    refused = client.post("/v2/repository/models/mlp/unload", headers=viewer)
    assert refused.status_code == 403 and "operator" in refused.get_json()["error"]  # the protocol's error form
    assert client.post("/v2/repository/index", headers=viewer).status_code == 403
    assert client.post("/v2/repository/models/mlp/unload", headers=operator).status_code == 200
    assert flask_app.extensions["flightdeck"].engine.models() == []  # answered after this process unloaded it
    assert client.get("/v2/models/mlp/ready").status_code in (400, 404)
    loaded = client.post("/v2/repository/models/mlp/load", headers=operator, json={"parameters": {}})
    assert loaded.status_code == 200 and loaded.get_json() == {}
    # Triton's version policy: the latest version is what a load of an undeployed model serves.
    assert [v.spec.version for v in flask_app.extensions["flightdeck"].engine.loaded("mlp")] == ["2"]
    bad = client.post("/v2/repository/models/mlp/load", headers=operator, data="not json")
    assert bad.status_code == 400 and "not valid JSON" in bad.get_json()["error"]
    misspelt = client.post("/v2/repository/index", headers=operator, json={"redy": True})
    assert misspelt.status_code == 400 and misspelt.get_json() == {
        "error": "unknown field(s) ['redy']; allowed: ['ready']"  # the protocol's form, naming the field
    }
    override = client.post("/v2/repository/models/mlp/load", headers=operator, json={"parameters": {"config": "{}"}})
    assert override.status_code == 400 and "config or file override" in override.get_json()["error"]
    with flask_app.extensions["flightdeck"].sessions() as session:
        events = session.scalars(select(AuditEvent).where(AuditEvent.actor.in_(["vic", "otto"])))
        trail = [(e.actor, e.action, e.target, e.outcome) for e in events]
    assert trail == [
        ("vic", "model.undeploy", "/v2/repository/models/mlp/unload", "denied"),
        ("vic", "http.repository.index", "/v2/repository/index", "denied"),
        ("otto", "model.undeploy", "mlp", "ok"),
        ("otto", "model.deploy", "mlp:2", "ok"),
    ]


def test_a_load_that_fails_here_is_a_400_with_the_reason_and_the_index_says_why(flask_app: Flask, home: Path) -> None:
    client: FlaskClient = flask_app.test_client()
    operator = token_for(flask_app, "otto", Role.OPERATOR)
    pushed = client.post(
        "/api/models",
        data={"archive": (io.BytesIO(ADDER), "a.tar.gz")},
        headers=operator,
        content_type="multipart/form-data",
    )
    assert pushed.status_code == 201
    stored = home / "registry" / "adder" / "1" / "model.onnx"
    stored.unlink()  # the disk lost it after the push: the registry's checks passed, this load cannot
    stored.write_bytes(b"not a model any more")
    failed = client.post("/v2/repository/models/adder/load", headers=operator)
    assert failed.status_code == 400
    assert failed.get_json()["error"].startswith("failed to load 'adder': could not load adder version 1 into blue")
    index = {e["name"]: e for e in client.post("/v2/repository/index", headers=operator).get_json()}
    assert index["adder"]["state"] == "UNAVAILABLE" and "could not load adder version 1" in index["adder"]["reason"]
    assert index["mlp"]["state"] == "READY" and flask_app.extensions["flightdeck"].engine.ready()
