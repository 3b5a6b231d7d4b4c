"""End to end: a faulty version goes live, the alert fires, chat hears it, the runbook rolls back.

Real gunicorn, real SQLite, a real chat receiver on 127.0.0.1 that fails its first deliveries,
the real rollback runbook run as a subprocess by the alert, and the resolved message at the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.rollout import Traffic, call, operator_token
from serving.demo_models import demo_manifest
from tests.servers import ChatServer, start_server, wait_until

RULE = """
rules:
  - name: high_error_rate
    severity: P0
    why: users see failures now
    condition: {metric: error_rate, aggregation: avg, window: 10s, op: ">", threshold: 0.2, by: [model, version]}
    for: 2s
    summary: "{model} v{version}: {value:.0%} of requests fail"
    runbook: rollback
    runbook_params: {model: "{model}"}
    automatic: {enabled: true, cooldown: 1m, max_attempts: 1}
"""


def faulty_mlp(folder: Path) -> None:
    """An 'mlp' v3 that passes warm-up and its golden sample but fails when the first value is exactly 0.5,
    which is what the load generator sends: a fault that only live traffic finds."""
    first = helper.make_node("Slice", ["input", "zero", "one", "one_axis"], ["head"])
    flat = helper.make_node("ReduceSum", ["head"], ["first"], keepdims=0)
    is_half = helper.make_node("Equal", ["first", "fhalf"], ["poisoned"])
    shape = helper.make_node("Where", ["poisoned", "bad_shape", "good_shape"], ["shape"])
    reshape = helper.make_node("Reshape", ["input", "shape"], ["flat"])
    weights = numpy_helper.from_array(np.full((64, 10), 0.01, np.float32), "w")
    out = helper.make_node("MatMul", ["flat", "w"], ["logits"])
    soft = helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)
    consts = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "one_axis"),
        numpy_helper.from_array(np.array(0.5, np.float32), "fhalf"),
        numpy_helper.from_array(np.array([-1, 64], np.int64), "good_shape"),
        numpy_helper.from_array(np.array([7, 13], np.int64), "bad_shape"),  # 64 values never fit 7 x 13
        weights,
    ]
    graph = helper.make_graph(
        [first, flat, is_half, shape, reshape, out, soft], "faulty",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=consts,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    manifest = demo_manifest("mlp", "1") | {"version": "3", "metadata": {"description": "fails on live traffic"}}
    x = [0.0] * 64
    manifest["golden"] = [
        {
            "inputs": {"input": {"datatype": "FP32", "shape": [1, 64], "data": x}},
            "outputs": {"probabilities": {"datatype": "FP32", "shape": [1, 10], "data": [0.1] * 10}},
            "atol": 1e-4,
            "rtol": 1e-3,
        }
    ]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_faulty_version_alerts_chat_and_is_rolled_back_by_its_runbook(home: Path, tmp_path: Path) -> None:
    faulty_mlp(tmp_path / "faulty" / "mlp" / "3")
    push_store(home, tmp_path / "faulty")  # v3 passes every registry check: only live traffic finds its fault
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "e2e.yaml").write_text(RULE)
    token = operator_token(home)
    env = {
        "FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_HISTORY_INTERVAL_S": "1", "FLIGHTDECK_ALERT_INTERVAL_S": "1",
        "FLIGHTDECK_OUTBOX_INTERVAL_S": "0.5", "FLIGHTDECK_ROLLOUT_TICK_S": "0.2", "FLIGHTDECK_ALERT_RULES_DIR": str(rules),
        "FLIGHTDECK_LEASE_TTL_S": "3", "FLIGHTDECK_OUTBOX_BACKOFF_S": "0.5",
    }  # fmt: skip
    with ChatServer(failures=2, retry_after_s=1) as chat:
        server = start_server(home, env)
        port = int(server.url.rsplit(":", 1)[1])
        try:
            admin = _admin_token(home)
            # Alertmanager's defaults (30 s wait, 5 min between a group's messages) shortened for the test.
            receiver = {"kind": "webhook", "config": {"url": chat.url, "allow_http": True}, "severities": ["P0"],
                        "group_wait": "0s", "group_interval": "1s"}  # fmt: skip
            call(port, "PUT", "/api/receivers/chat", admin, receiver)
            traffic = Traffic(port, clients=2)
            try:
                traffic.settled("1", after=0.0)
                rollout = call(port, "POST", "/api/models/mlp/deploy", token, {"version": "3", "strategy": "bluegreen"})
                wait_until(
                    lambda: call(port, "GET", f"/api/rollouts/{rollout['id']}", token)["state"] == "succeeded",
                    60,
                    "v3 live",
                )
                fault_at = time.monotonic()
                firing = wait_until(
                    lambda: [m for m in chat.received if m["status"] == "firing"], 90, "the firing message"
                )
                message_s = time.monotonic() - fault_at
                wait_until(
                    lambda: traffic.settled("1", after=time.monotonic() - 0.5, timeout=60) is not None, 90, "rollback"
                )
                resolved = wait_until(
                    lambda: [m for m in chat.received if m["status"] == "resolved"], 90, "the resolved message"
                )
            finally:
                traffic.close()
            alerts = call(port, "GET", "/api/alerts", token)["alerts"]
            runs = call(port, "GET", "/api/runbooks/runs?runbook=rollback", token)
        finally:
            assert server.stop() == 0
    print(f"\nfault to chat message: {message_s:.1f} s (the receiver refused the first 2 deliveries)")
    alert = firing[0]["alerts"][0]
    assert alert["labels"]["alertname"] == "high_error_rate" and alert["labels"]["version"] == "3"
    assert "of requests fail" in alert["annotations"]["summary"] and "nan" not in alert["annotations"]["summary"]
    assert resolved[0]["alerts"][0]["labels"]["version"] == "3"
    states = {a["labels"]["version"]: a["state"] for a in alerts if a["rule"] == "high_error_rate"}
    assert states["3"] == "resolved" and states.get("1", "inactive") == "inactive"
    run_list = runs["runs"] if isinstance(runs, dict) else runs
    assert any(r["state"] == "succeeded" and r["trigger"] == "alert" for r in run_list), run_list
    statuses = {s for _, s, _ in traffic.seen}
    assert statuses <= {200, 500}  # only the faulty version's failures, nothing else
    assert {v for t, s, v in traffic.seen if s == 200} >= {"1"}


def push_store(home: Path, store: Path) -> None:
    """Push the versions in a plain <name>/<version>/ store into the home's registry."""
    from controlplane.db import make_engine, session_factory
    from controlplane.registry.service import Registry

    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    pushed = Registry(session_factory(engine), home).register_store(store)
    engine.dispose()
    assert [(row.name, row.version) for row, _ in pushed] == [("mlp", "3")]


def _admin_token(home: Path) -> str:
    from datetime import UTC, datetime

    from controlplane.auth import Role
    from controlplane.auth import tokens as token_service
    from controlplane.auth import users as user_service
    from controlplane.db import make_engine, session_factory

    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    with session_factory(engine)() as session:
        user = user_service.create_user(session, "ada", "a-long-password-1", Role.ADMIN, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "e2e", Role.ADMIN, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return secret
