"""The served set is desired state: push then deploy on a running app, undeploy, restart, an old home migrated."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from controlplane.app import create_app
from controlplane.auth import Role
from controlplane.cli import cli
from controlplane.migrate import upgrade
from controlplane.models import AuditEvent, Deployment, ModelVersion, SlotStatus
from tests.conftest import link_store
from tests.controlplane.conftest import token_for
from tests.controlplane.registry.conftest import WEIGHTS, add_manifest, add_model, good_members, make_tar

X = [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 8.0]]


@pytest.fixture
def app_config(app_config: dict) -> dict:
    """Serve every deployed model (no per-node filter), at the shortest text bucket."""
    return app_config | {"log_sample_rate": 0.0, "warmup_max_sequence": 16}


def push_adder(client: FlaskClient, headers: dict[str, str], version: str = "1") -> None:
    archive = make_tar(good_members(add_model(), add_manifest(version=version)))
    response = client.post(
        "/api/models",
        data={"archive": (io.BytesIO(archive), "adder.tar.gz")},
        headers=headers,
        content_type="multipart/form-data",
    )
    assert response.status_code == 201, response.get_json()


def infer_adder(client: FlaskClient):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [v for row in X for v in row]}]}
    return client.post("/v2/models/adder/infer", json=body)


def events(app: Flask, action: str) -> list[tuple[str, str, str]]:
    with app.extensions["flightdeck"].sessions() as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id))
        return [(e.actor, e.target, e.outcome) for e in rows]


def test_a_pushed_model_is_deployed_on_the_running_app_and_serves_without_a_restart(
    app: Flask, client: FlaskClient, operator: dict
) -> None:
    services = app.extensions["flightdeck"]
    push_adder(client, operator)
    assert infer_adder(client).status_code == 404  # pushed is not served
    started = client.post("/api/models/adder/deploy", json={"version": "1"}, headers=operator)
    assert started.status_code == 202, started.get_json()
    assert started.get_json() == {
        "model": "adder", "version": "1", "first_deploy": True, "generation": 1, "state": "loading",
    }  # fmt: skip
    services.reconciler.reconcile()  # NOTE: what the woken reconciler thread does; run here to be deterministic
    answer = infer_adder(client)
    assert answer.status_code == 200, answer.get_json()
    out = answer.get_json()["outputs"][0]
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 4), np.array(X) + WEIGHTS, rtol=1e-6)
    assert answer.get_json()["model_version"] == "1"
    with services.sessions() as session:
        status = session.scalars(select(SlotStatus).where(SlotStatus.model == "adder", SlotStatus.slot == "blue")).one()
    # "loaded" is reported only after the version's golden samples passed in this process (else "failed").
    assert (status.slot, status.version, status.state, status.error) == ("blue", "1", "loaded", "")
    assert services.engine.ready() and sorted(services.engine.models()) == ["adder", "mlp", "textcls"]
    assert events(app, "model.deploy") == [("otto", "adder:1", "ok")]
    again = client.post("/api/models/adder/deploy", json={"version": "1"}, headers=operator)
    assert again.status_code == 409 and "already the stable version" in again.get_json()["error"]["message"]
    missing = client.post("/api/models/nobody/deploy", json={"version": "1"}, headers=operator)
    assert missing.status_code == 404 and "registry" in missing.get_json()["error"]["message"]


def test_undeploy_unloads_everywhere_and_is_audited_refused_and_guarded(
    app: Flask, client: FlaskClient, operator: dict
) -> None:
    services = app.extensions["flightdeck"]
    viewer = token_for(app, "vic", Role.VIEWER)
    assert client.post("/api/models/textcls/undeploy", headers=viewer).status_code == 403
    done = client.post("/api/models/textcls/undeploy", headers=operator)
    assert done.status_code == 200, done.get_json()
    assert done.get_json() == {"model": "textcls", "undeployed": True, "versions": {"blue": "1"}}
    services.reconciler.reconcile()
    assert services.engine.models() == ["mlp"] and services.engine.ready()  # the engine forgot textcls
    assert client.get("/v2/models/textcls").status_code == 404
    assert client.get("/api/models/textcls/deployment").status_code == 404
    with services.sessions() as session:
        assert session.scalars(select(SlotStatus).where(SlotStatus.model == "textcls")).all() == []
        assert session.scalar(select(ModelVersion).where(ModelVersion.name == "textcls").limit(1)) is not None
    again = client.post("/api/models/textcls/undeploy", headers=operator)
    assert again.status_code == 404 and "not deployed" in again.get_json()["error"]["message"]
    # During a rollout: refused, and the model keeps serving.
    assert client.post("/api/models/mlp/deploy", json={"version": "2"}, headers=operator).status_code == 202
    refused = client.post("/api/models/mlp/undeploy", headers=operator)
    assert refused.status_code == 409 and "abort or roll it back" in refused.get_json()["error"]["message"]
    assert events(app, "model.undeploy") == [
        ("vic", "/api/models/textcls/undeploy", "denied"),
        ("otto", "textcls", "ok"),
        ("otto", "textcls", "error"),
        ("otto", "mlp", "error"),
    ]
    # Deployed again later, it serves again (the removal left nothing that reads as already applied).
    assert client.post("/api/models/textcls/deploy", json={"version": "2"}, headers=operator).status_code == 202
    services.reconciler.reconcile()
    assert [(v.slot, v.spec.version) for v in services.engine.loaded("textcls")] == [("blue", "2")]


def test_a_restart_serves_exactly_the_stored_set(app_config: dict, home: Path) -> None:
    first = create_app(app_config)
    client = first.test_client()
    operator = token_for(first, "otto", Role.OPERATOR)
    push_adder(client, operator)
    assert client.post("/api/models/adder/deploy", json={"version": "1"}, headers=operator).status_code == 202
    assert client.post("/api/models/mlp/undeploy", headers=operator).status_code == 200
    first.extensions["flightdeck"].shutdown(5)
    second = create_app(app_config)
    try:
        engine = second.extensions["flightdeck"].engine
        assert engine.models() == ["adder", "textcls"] and engine.ready()
        assert infer_adder(second.test_client()).status_code == 200
    finally:
        second.extensions["flightdeck"].shutdown(5)


def metric(client: FlaskClient, name: str, **labels: str) -> float | None:
    """Return one series' value from /metrics (labels must all match), or None when it is absent."""
    text = client.get("/metrics").get_data(as_text=True)
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_metrics_stop_showing_what_is_no_longer_served(app: Flask, client: FlaskClient, operator: dict) -> None:
    # NOTE: the gauges are livemax over processes: a label left at 1 would show textcls served for ever.
    assert metric(client, "flightdeck_model_info", model="textcls", version="1", slot="blue") == 1.0
    assert metric(client, "flightdeck_traffic_weight", model="textcls", slot="blue") == 100.0
    assert client.post("/api/models/textcls/undeploy", headers=operator).status_code == 200
    app.extensions["flightdeck"].reconciler.reconcile()
    assert metric(client, "flightdeck_model_info", model="textcls", version="1", slot="blue") == 0.0
    assert metric(client, "flightdeck_traffic_weight", model="textcls", slot="blue") == 0.0
    assert metric(client, "flightdeck_model_info", model="mlp", version="1", slot="blue") == 1.0


def test_a_node_with_nothing_deployed_is_ready(
    app: Flask, client: FlaskClient, operator: dict, app_config: dict
) -> None:
    # As Triton with no models: undeploying the last model must not turn the node unready (a P0 alert).
    for model in ("mlp", "textcls"):
        assert client.post(f"/api/models/{model}/undeploy", headers=operator).status_code == 200
    services = app.extensions["flightdeck"]
    services.reconciler.reconcile()
    assert services.engine.models() == []
    assert client.get("/v2/health/ready").status_code == 200
    restarted = create_app(app_config)
    try:
        assert restarted.test_client().get("/v2/health/ready").status_code == 200
        restarted.extensions["flightdeck"].engine.begin_drain()
        assert restarted.test_client().get("/v2/health/ready").status_code == 503
    finally:
        restarted.extensions["flightdeck"].shutdown(5)


def test_the_per_node_filter_serves_only_its_part_of_the_stored_set(app_config: dict) -> None:
    only_mlp = create_app(app_config | {"load_models": "mlp,adder"})
    try:
        assert only_mlp.extensions["flightdeck"].engine.models() == ["mlp"]
    finally:
        only_mlp.extensions["flightdeck"].shutdown(5)


@pytest.fixture
def old_home(tmp_path: Path, demo_store: Path) -> Iterator[Path]:
    """A home from before the registry: demo models as folders in HOME/models, a database that never served."""
    path = tmp_path / "old"
    link_store(demo_store, path)
    upgrade(f"sqlite:///{path / 'flightdeck.db'}")
    yield path


def test_an_old_home_is_migrated_into_the_registry_once_and_serves_as_before(old_home: Path, app_config: dict) -> None:
    config = app_config | {"home": str(old_home), "load_models": "mlp"}
    app = create_app(config)
    services = app.extensions["flightdeck"]
    try:
        assert services.engine.models() == ["mlp"]
        with services.sessions() as session:
            stored = [(v.name, v.version, v.pushed_by) for v in session.scalars(select(ModelVersion))]
            deployed = {d.model: (d.blue_version, d.blue_weight) for d in session.scalars(select(Deployment))}
            pushes = session.scalars(select(AuditEvent).where(AuditEvent.action == "model.push")).all()
        assert sorted(stored) == [(m, v, "system:model-store") for m in ("mlp", "textcls") for v in ("1", "2")]
        assert deployed == {"mlp": ("1", 100), "textcls": ("1", 100)}
        assert {(e.actor, e.outcome) for e in pushes} == {("system", "ok")} and len(pushes) == 4
        assert not (old_home / "models").exists() and (old_home / "models.migrated" / "mlp" / "2").is_dir()
        assert not any(p.is_symlink() for p in (old_home / "registry").rglob("*"))  # the registry owns real copies
    finally:
        services.shutdown(5)
    again = create_app(config)  # the next start reads nothing from disk but the registry
    try:
        with again.extensions["flightdeck"].sessions() as session:
            assert len(session.scalars(select(ModelVersion)).all()) == 4
        assert not (old_home / "models.migrated-2").exists()
    finally:
        again.extensions["flightdeck"].shutdown(5)


def test_the_cli_pushes_deploys_and_undeploys_a_new_model(app: Flask, home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    archive = tmp_path / "adder.tar.gz"
    archive.write_bytes(make_tar(good_members()))
    runner = CliRunner()
    pushed = runner.invoke(cli, ["registry", "push", str(archive)])
    assert pushed.exit_code == 0, pushed.output
    deployed = runner.invoke(cli, ["rollout", "deploy", "adder", "1"])
    assert deployed.exit_code == 0 and "first deploy of version 1" in deployed.output, deployed.output
    app.extensions["flightdeck"].reconciler.reconcile()  # the running app picks it up from the database
    assert infer_adder(app.test_client()).status_code == 200
    listed = runner.invoke(cli, ["models"])
    assert "adder: 1  (serves 1)" in listed.output and "mlp: 1, 2  (serves 1)" in listed.output, listed.output
    gone = runner.invoke(cli, ["rollout", "undeploy", "adder", "--yes"])
    assert gone.exit_code == 0 and "adder: undeployed (blue v1)" in gone.output, gone.output
    app.extensions["flightdeck"].reconciler.reconcile()
    assert "adder" not in app.extensions["flightdeck"].engine.models()
    assert "adder: 1  (not deployed)" in runner.invoke(cli, ["models"]).output
