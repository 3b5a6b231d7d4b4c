"""Under continuous load over real HTTP (gunicorn, two workers), a rollout and a rollback fail no request."""

from __future__ import annotations

import time
from pathlib import Path

from bench.rollout import Traffic, call, operator_token
from tests.servers import start_server


def port_of(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_blue_green_rollout_and_rollback_under_load_fail_nothing(home: Path) -> None:
    token = operator_token(home)
    server = start_server(
        home, {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_ROLLOUT_TICK_S": "0.1"}
    )
    port = port_of(server)
    try:
        traffic = Traffic(port, clients=4)
        try:
            traffic.settled("1", after=0.0)
            rollout = call(port, "POST", "/api/models/mlp/deploy", token, {"version": "2", "strategy": "bluegreen"})
            while rollout["state"] != "succeeded":
                assert rollout["state"] in ("loading", "progressing"), rollout
                rollout = call(port, "GET", f"/api/rollouts/{rollout['id']}", token)
            switch_s = traffic.settled("2", after=time.monotonic())
            result = call(port, "POST", "/api/models/mlp/rollback", token)
            assert result["version"] == "1" and not result["reloaded"], result
            rollback_s = traffic.settled("1", after=time.monotonic())
        finally:
            traffic.close()
        statuses = {s for _, s, _ in traffic.seen}
        print(
            f"\nrequests {len(traffic.seen)}, statuses {statuses}; switch {switch_s * 1000:.0f} ms, rollback {rollback_s * 1000:.0f} ms"
        )
        assert statuses == {200}, "a request failed during the rollout or rollback"
        assert {v for _, _, v in traffic.seen} == {"1", "2"}
        assert rollback_s < 0.5  # both workers moved within a few reconcile polls
    finally:
        assert server.stop() == 0
