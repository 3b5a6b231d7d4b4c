"""Per-node identity: FLIGHTDECK_NODE labels every metric and prefixes every process name (NODE:PID).

History rows, slot and engine status reports, the API and the console's process lists all carry
the node, so several nodes' rows can be told apart and grouped; the default is the host name.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from controlplane.auth import Role
from controlplane.config import ConfigError, load_settings
from controlplane.models import SlotSample, SlotStatus
from tests.controlplane.conftest import log_in

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? \S+$")


@pytest.fixture
def app_config(app_config: dict) -> dict:
    return app_config | {"node": "node-a", "load_models": "mlp", "log_sample_rate": 0.0}


def test_every_metric_series_carries_the_node(client) -> None:
    assert client.post("/v2/models/mlp/infer", json={"inputs": [
        {"name": "input", "shape": [1, 8], "datatype": "FP32", "data": [0.0] * 8}]}).status_code == 400  # fmt: skip
    text = client.get("/metrics").get_data(as_text=True)
    samples = [SAMPLE.match(line) for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all(samples), "a line of /metrics is not a sample"
    assert any(s["name"] == "flightdeck_engine_ready" for s in samples)
    unlabelled = [s.group(0) for s in samples if 'node="node-a"' not in (s["labels"] or "")]
    assert unlabelled == []


def test_history_and_status_rows_name_the_node_and_the_api_and_console_group_by_it(app, client) -> None:
    services = app.extensions["flightdeck"]
    assert services.sampler.sample() > 0
    with services.sessions() as session:
        processes = set(session.scalars(select(SlotSample.process)))
        assert processes == {f"node-a:{os.getpid()}"}
        # Another node's report of the same slot, as a second host would write it.
        session.add(SlotStatus(process="node-b:7", model="mlp", slot="blue", version="1", state="loaded", error="",
                               generation=1, updated_at=datetime.now(UTC)))  # fmt: skip
        session.commit()
    reports = client.get("/api/models/mlp/deployment").get_json()["processes"]
    blue = [(r["node"], r["process"]) for r in reports if r["slot"] == "blue"]
    assert blue == [("node-a", f"node-a:{os.getpid()}"), ("node-b", "node-b:7")]
    engine = client.get("/api/engine/desired").get_json()["processes"]
    assert [p["node"] for p in engine] == ["node-a"]

    viewer = app.test_client()
    log_in(viewer, app, "vera", Role.VIEWER)
    page = viewer.get("/models/mlp").get_data(as_text=True)
    groups = re.findall(r'<div class="node" data-node="([^"]+)">', page)
    assert groups[:2] == ["node-a", "node-b"]  # the blue slot's processes, one group per node


def test_the_node_defaults_to_the_host_name_and_refuses_odd_names(tmp_path) -> None:
    assert load_settings(environ={}, overrides={"home": str(tmp_path)}).node_name == socket.gethostname()
    with pytest.raises(ConfigError, match="FLIGHTDECK_NODE"):
        load_settings(environ={"FLIGHTDECK_NODE": "a b"}, overrides={"home": str(tmp_path)})
