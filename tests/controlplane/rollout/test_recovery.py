"""Rollback that must reload, a restart mid-rollout, and the rollout CLI."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from click.testing import CliRunner

from bench.rollout import call, operator_token
from controlplane.app import create_app
from controlplane.auth import Role
from controlplane.cli import cli
from tests.controlplane.conftest import token_for
from tests.controlplane.rollout.test_rollouts import advance, deploy, settle, versions_served
from tests.servers import start_server


def test_rollback_after_scale_down_reloads_and_verifies_before_moving_traffic(app_config, home) -> None:
    # NOTE: its own app, and no other in this process: two would report slot status under one process id.
    app_config["scale_down_delay_s"] = 0.0
    application = create_app(app_config)
    client = application.test_client()
    try:
        headers = token_for(application, "otto", Role.OPERATOR)
        rollout = deploy(client, headers, version="2", strategy="bluegreen")
        settle(application)
        # With no scale-down delay the old stable version goes in the same controller step.
        assert advance(application) == [f"{rollout['id']}: loaded -> succeeded", "mlp: scaled down 1 from blue"]
        assert [v.slot for v in application.extensions["flightdeck"].engine.loaded("mlp")] == ["green"]
        back = client.post("/api/models/mlp/rollback", headers=headers).get_json()
        assert back["reloaded"] is True and back["version"] == "1"
        assert versions_served(client, 10) == {"2": 10}  # nothing moves until v1 is loaded and verified
        settle(application)  # loads v1 into blue, checks its golden samples
        assert versions_served(client, 10) == {"2": 10}
        assert advance(application) == [f"{back['rollout']}: loaded -> succeeded", "mlp: scaled down 2 from green"]
        assert versions_served(client, 10) == {"1": 10}
    finally:
        application.extensions["flightdeck"].shutdown(5)


def test_a_restarted_process_resumes_the_rollout_where_the_database_says(app_config, operator, app, client) -> None:
    rollout = deploy(client, operator, version="2", steps=[50, 100], pause_s=3600)
    settle(app)
    advance(app)
    app.extensions["flightdeck"].shutdown(5)  # the process goes away mid-rollout
    restarted = create_app(app_config)
    try:
        # A fresh process converges to the stored desired state before it serves: both versions, 50/50.
        engine = restarted.extensions["flightdeck"].engine
        assert sorted((v.slot, v.spec.version) for v in engine.loaded("mlp")) == [("blue", "1"), ("green", "2")]
        assert engine.weights("mlp") == {"blue": 50, "green": 50}
        detail = restarted.test_client().get(f"/api/rollouts/{rollout['id']}").get_json()
        assert detail["state"] == "progressing" and detail["traffic_percent"] == 50
    finally:
        restarted.extensions["flightdeck"].shutdown(5)


def test_killed_server_restarts_into_the_same_rollout(home: Path) -> None:
    token = operator_token(home)
    env = {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_ROLLOUT_TICK_S": "0.1"}
    server = start_server(home, env)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        body = {"version": "2", "steps": [25, 100], "pause_s": 3600}
        rollout = call(port, "POST", "/api/models/mlp/deploy", token, body)
        assert rollout["state"] == "loading"
        deadline = time.monotonic() + 60
        while rollout["state"] != "progressing":
            assert time.monotonic() < deadline, rollout
            rollout = call(port, "GET", f"/api/rollouts/{rollout['id']}", token)
    finally:
        server.stop(signal.SIGKILL)  # no drain, no goodbye
    server = start_server(home, env)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        status_now = call(port, "GET", "/api/engine", token)
        mlp = next(m for m in status_now["models"] if m["name"] == "mlp")
        assert mlp["weights"] == {"blue": 75, "green": 25}
        assert {s: info["version"] for s, info in mlp["slots"].items()} == {"blue": "1", "green": "2"}
        after = call(port, "GET", f"/api/rollouts/{rollout['id']}", token)
        assert after["state"] == "progressing" and after["step_index"] == 0
    finally:
        assert server.stop() == 0


def test_the_cli_deploys_reports_and_rolls_back(app, client, home, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    runner = CliRunner()
    started = runner.invoke(cli, ["rollout", "deploy", "mlp", "2", "--strategy", "bluegreen"])
    assert started.exit_code == 0 and "mlp 1 -> 2 (bluegreen), loading" in started.output, started.output
    settle(app)
    advance(app)
    shown = runner.invoke(cli, ["rollout", "status", "mlp"])
    assert "green  version 2        weight 100% (stable)" in shown.output, shown.output
    back = runner.invoke(cli, ["rollout", "rollback", "mlp"])
    assert back.exit_code == 0 and "returning to version 1" in back.output
    settle(app)
    assert versions_served(client, 10) == {"1": 10}
    refused = runner.invoke(cli, ["rollout", "deploy", "mlp", "9"])
    assert refused.exit_code != 0
