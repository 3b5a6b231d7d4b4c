"""Runbooks from a shell against the real server (gunicorn on 127.0.0.1), with an operator's API token."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.rollout import call, operator_token
from tests.runbooks.conftest import RUNBOOKS, run_script, step_lines
from tests.servers import start_server


@pytest.mark.slow
def test_rollback_and_a_diagnostic_snapshot_from_a_shell(home: Path, tmp_path: Path) -> None:
    token = operator_token(home)  # a user named 'bench' with an operator token
    server = start_server(home, {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_ROLLOUT_TICK_S": "0.1"})
    try:
        port = int(server.url.rsplit(":", 1)[1])
        rollout = call(port, "POST", "/api/models/mlp/deploy", token, {"version": "2", "strategy": "bluegreen"})
        deadline = time.monotonic() + 60
        while rollout["state"] != "succeeded":  # the server's controller says when (polling, as servers.py does)
            assert time.monotonic() < deadline and rollout["state"] in ("loading", "progressing"), rollout
            rollout = call(port, "GET", f"/api/rollouts/{rollout['id']}", token)
        env = {"FLIGHTDECK_URL": server.url, "FLIGHTDECK_TOKEN": token}

        done = run_script(RUNBOOKS / "rollback.py", "--model", "mlp", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        rollback, verify = step_lines(done.stdout)
        assert rollback["status"] == "ok" and rollback["detail"].startswith("traffic returns to version 1 at once")
        assert verify["status"] == "ok" and "serve version 1 from blue with all traffic" in verify["detail"]
        mlp = next(m for m in call(port, "GET", "/api/engine", token)["models"] if m["name"] == "mlp")
        assert mlp["weights"] == {"blue": 100, "green": 0}

        out = tmp_path / "out"
        snap = run_script(
            RUNBOOKS / "diagnostics.py", "--out", "snap.json", env={**env, "FLIGHTDECK_OUTPUT_DIR": str(out)}
        )
        assert snap.returncode == 0, snap.stdout + snap.stderr
        assert {s["status"] for s in step_lines(snap.stdout)} == {"ok"}
        snapshot = json.loads((out / "snap.json").read_text())
        assert [m["name"] for m in snapshot["engine"]["models"]] == ["mlp"]
        assert "flightdeck_engine_ready" in snapshot["metrics"]["exposition"]
        deploys = [(e["action"], e["actor"]) for e in snapshot["deploys"]["events"]]
        assert ("rollout.rollback", "bench") in deploys and ("rollout.start", "bench") in deploys
        assert "rows" in snapshot["history"] and "events" in snapshot["errors"]
    finally:
        assert server.stop() == 0
