"""The real product under gunicorn: graceful drain on SIGTERM, and metrics across several workers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from tests.conftest import copy_home
from tests.servers import Server, start_server, wait_until


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path):
    """One server on the defaults for the tests that only send it requests (each start costs ~4 s of CPU)."""
    home = copy_home(template_home, tmp_path_factory.mktemp("shared") / "home")
    server = start_server(home, {"FLIGHTDECK_WORKERS": "1", "FLIGHTDECK_LOAD_MODELS": "mlp,textcls"})
    yield server
    assert server.stop() == 0


def textcls_body(length: int, seed: int) -> dict:
    ids = [(seed * 7919 + i * 31) % 29000 + 1 for i in range(length)]
    return {
        "inputs": [
            {"name": "input_ids", "shape": [1, length], "datatype": "INT64", "data": ids},
            {"name": "attention_mask", "shape": [1, length], "datatype": "INT64", "data": [1] * length},
        ]
    }


def metric(text: str, name: str, **labels: str) -> float:
    """Sum a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_sigterm_finishes_every_accepted_request_then_exits(home: Path) -> None:
    server = start_server(
        home,
        {"FLIGHTDECK_LOAD_MODELS": "textcls", "FLIGHTDECK_MAX_BATCH_SIZE": "1", "FLIGHTDECK_DRAIN_GRACE_S": "60"},
    )
    results: list[int] = []
    lock = threading.Lock()

    def call(seed: int) -> None:
        status, body, _ = server.post("/v2/models/textcls/infer", textcls_body(512, seed), timeout=60)
        with lock:
            results.append(status if status != 200 or len(body["outputs"][0]["data"]) == 3 else -1)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(24)]
    try:
        for thread in threads:
            thread.start()
        # Synchronise on the server's own account of its queue, not on time.
        deadline = time.monotonic() + 30
        while metric(server.metrics(), "flightdeck_queue_depth", model="textcls") < 8:
            assert time.monotonic() < deadline, "requests never queued up"
        queued_at_term = metric(server.metrics(), "flightdeck_queue_depth", model="textcls")
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        assert server.process.wait(60) == 0
    finally:
        server.stop(signal.SIGKILL)
    assert queued_at_term >= 8
    assert sorted(results) == [200] * 24, server.output()[-3000:]
    assert "all requests finished" in server.output()
    assert "SIGSEGV" not in server.output()  # workers must not inherit ONNX Runtime state from the master
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        server.get("/v2/health/live", timeout=2)


def test_metrics_add_up_across_workers_and_one_process_leads_the_scheduler(home: Path) -> None:
    server = start_server(home, {"FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_LOAD_MODELS": "mlp"})
    try:
        # /v2/health/ready answers for one worker; the gauge is the minimum over all of them.
        deadline = time.monotonic() + 60
        while metric(server.metrics(), "flightdeck_engine_ready") != 1:
            assert time.monotonic() < deadline, "the second worker never became ready"
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}
        for _ in range(30):  # a new connection each time, so both workers take some
            assert server.post("/v2/models/mlp/infer", body)[0] == 200

        # Each worker writes its counts at most metricsflush.FLUSH_INTERVAL_S after the request: wait for both.
        def all_counted() -> str | None:
            text = server.metrics()
            return (
                text
                if metric(text, "flightdeck_inference_requests_total", model="mlp", outcome="success") >= 30
                else None
            )

        text = wait_until(all_counted, 30, "every worker's counts in /metrics")
        assert metric(text, "flightdeck_inference_requests_total", model="mlp", outcome="success") == 30
        assert metric(text, "flightdeck_inference_count_total", model="mlp") == 30
        assert re.search(r'flightdeck_model_info\{.*model="mlp".*\} 1\.0', text)
        with sqlite3.connect(home / "flightdeck.db") as db:
            holders = db.execute("select holder from leases where name = 'scheduler'").fetchall()
        assert len(holders) == 1
    finally:
        assert server.stop() == 0


def test_the_workers_of_a_node_batch_by_one_measurement_of_each_version(home: Path) -> None:
    stale = home / "measured" / f"{'0' * 32}.json"  # a record of an earlier start: this one measures afresh
    stale.parent.mkdir(parents=True)
    stale.write_text('{"curve": null}')
    env = {"FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_LOAD_MODELS": "textcls", "FLIGHTDECK_BATCH_LIMIT_FROM_COST": "true"}
    server = start_server(home, env)
    try:
        wait_until(lambda: metric(server.metrics(), "flightdeck_engine_ready") == 1, 60, "both workers to be ready")
        shown = set()
        for _ in range(12):  # a new connection each time, so both workers answer some
            status, config = server.get("/v2/models/textcls/config")
            assert status == 200
            p = config["parameters"]
            shown.add((p["batch_limits"]["string_value"], p["batch_cost_ms_per_sample"]["string_value"]))
        assert len(shown) == 1, shown  # the same limits and the same timings, to the last digit, from either
        log = server.output()
        assert log.count("textcls 1: batch limits") == 2, log[-3000:]
        assert log.count("from its cost curve") == 1 and log.count("from the node's measurement") == 1

        # each worker's start-up heap is out of the collector's reach: a full collection of it held a loop 100 ms
        def frozen() -> list[int] | None:
            counts = [int(n) for n in re.findall(r"start-up heap frozen \((\d+) objects\)", server.output())]
            return counts if len(counts) == 2 else None

        counts = wait_until(frozen, 30, "both workers to say they are up")
        assert min(counts) > 50_000, counts
        assert not stale.exists() and len(list((home / "measured").glob("*.json"))) == 1
    finally:
        assert server.stop() == 0


def test_a_first_start_pushes_the_demo_models_through_the_registry_and_a_restart_serves_the_same(
    tmp_path: Path,
) -> None:
    home = tmp_path / "fresh"
    env = {"FLIGHTDECK_DEMO_MODELS": "true", "FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16"}
    server = start_server(home, env)  # the master's `prepare` child pushes them; ONNX Runtime stays out of the master
    try:
        assert server.get("/v2/models/mlp/ready")[0] == 200
    finally:
        assert server.stop() == 0
    with sqlite3.connect(home / "flightdeck.db") as db:
        versions = db.execute(
            "SELECT name, version, pushed_by, golden_passed FROM model_versions ORDER BY id"
        ).fetchall()
        deployed = db.execute("SELECT model, blue_version, blue_weight FROM deployments ORDER BY model").fetchall()
        audit = db.execute(
            "SELECT actor, action, outcome FROM audit_events WHERE actor = 'system' AND action LIKE 'model.%'"
        ).fetchall()
    assert versions == [(m, v, "system:model-store", 1) for m in ("mlp", "textcls") for v in ("1", "2")]
    assert deployed == [("mlp", "1", 100), ("textcls", "1", 100)]
    assert sorted(audit) == sorted([("system", "model.push", "ok")] * 4 + [("system", "model.deploy", "ok")] * 2)
    assert not (home / "models").exists() and list((home / "tmp").iterdir()) == []
    again = start_server(home, env)
    try:
        assert again.get("/v2/models/mlp/ready")[0] == 200
    finally:
        assert again.stop() == 0
    with sqlite3.connect(home / "flightdeck.db") as db:
        assert db.execute("SELECT count(*) FROM model_versions").fetchone() == (4,)


def raw_exchange(url: str, data: bytes, chunk: int = 16 * 1024) -> bytes:
    """Send raw bytes over one connection (in pieces, as a slow client would); return all the server answered."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            for start in range(0, len(data), chunk):
                sock.sendall(data[start : start + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-way: what it answered is still readable
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
        return answer


def test_a_request_head_over_the_limit_is_refused_and_a_normal_one_still_served(shared_server: Server) -> None:
    server = shared_server
    huge_header = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (200 * 1024) + b"\r\n\r\n"
    assert raw_exchange(server.url, huge_header).startswith(b"HTTP/1.1 431 ")
    many_headers = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 20000 + b"\r\n"
    assert raw_exchange(server.url, many_headers).startswith(b"HTTP/1.1 431 ")
    long_url = b"GET /v2/health/live?" + b"q" * (200 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert raw_exchange(server.url, long_url).startswith(b"HTTP/1.1 431 ")
    # A body far larger than the head limit is not a head: a 1 MiB upload's bytes are not counted.
    big_body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                       "data": [0.25] * 64}], "id": "x" * (1024 * 1024)}).encode()  # fmt: skip
    status, body, _ = server.post("/v2/models/mlp/infer", big_body)
    assert status == 200 and body["id"] == "x" * (1024 * 1024)
    assert server.get("/v2/health/live")[0] == 200


def failed_login_address(server, forwarded_for: str) -> str:
    """Fail one login with an X-Forwarded-For header; return the address its audit event recorded."""
    status, _, _ = server.post(
        "/api/session", {"name": "nobody", "password": "wrong-password"},
        headers={"Content-Type": "application/json", "X-Forwarded-For": forwarded_for},
    )  # fmt: skip
    assert status == 401
    with sqlite3.connect(server.home / "flightdeck.db") as db:
        (address,) = db.execute("SELECT address FROM audit_events ORDER BY id DESC LIMIT 1").fetchone()
    return address


def test_a_forwarded_address_counts_only_from_a_proxy_named_in_forwarded_allow_ips(
    shared_server: Server, home: Path
) -> None:
    assert failed_login_address(shared_server, "203.0.113.9") == "127.0.0.1"  # the default trusts no proxy
    server = start_server(home, {"FLIGHTDECK_LOAD_MODELS": "mlp", "FORWARDED_ALLOW_IPS": "127.0.0.1"})
    try:
        address = failed_login_address(server, "203.0.113.9")
    finally:
        assert server.stop() == 0
    assert address == "203.0.113.9"


def test_concurrent_requests_on_the_event_loop_are_batched_and_each_answer_is_plain_onnx_runtimes(
    shared_server: Server,
) -> None:
    import numpy as np
    import onnxruntime as ort

    server = shared_server
    model = next(m.parent for m in server.home.rglob("manifest.json") if json.loads(m.read_text())["name"] == "textcls"
                 and str(json.loads(m.read_text())["version"]) == "1") / "model.onnx"  # fmt: skip
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    bodies = [textcls_body(16 + (seed % 3) * 8, seed) for seed in range(32)]  # three lengths: three shape groups
    answers: dict[int, tuple[int, dict]] = {}

    def call(seed: int) -> None:
        status, body, _ = server.post("/v2/models/textcls/infer", bodies[seed], timeout=60)
        answers[seed] = (status, body)

    def stats() -> tuple[int, int]:
        s = server.get("/v2/models/textcls/stats")[1]["model_stats"][0]
        return s["inference_count"], s["execution_count"]

    before = stats()
    for _ in range(5):  # NOTE: rounds until the server reports a batch of more than one (almost always the first)
        threads = [threading.Thread(target=call, args=(seed,)) for seed in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        inferences, executions = (a - b for a, b in zip(stats(), before, strict=True))
        if executions < inferences:
            break
    assert executions < inferences, "32 concurrent requests never shared a batch"
    for seed, body in enumerate(bodies):
        status, answer = answers[seed]
        assert status == 200, answer
        feeds = {t["name"]: np.asarray(t["data"], dtype=np.int64).reshape(t["shape"]) for t in body["inputs"]}
        expected = session.run(None, feeds)[0]
        got = np.asarray(answer["outputs"][0]["data"], dtype=np.float32).reshape(answer["outputs"][0]["shape"])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_ctrl_c_on_the_master_drains_every_worker_promptly(home: Path) -> None:
    """gunicorn passes SIGINT on as SIGQUIT; a worker that ignored it would be killed after the 60 s grace."""
    server = start_server(
        home, {"FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_DRAIN_GRACE_S": "60"}
    )
    wait_until(lambda: server.output().count(" ready: ") == 2, 60, "both workers ready")
    started = time.monotonic()
    assert server.stop(signal.SIGINT, timeout=30) == 0
    assert time.monotonic() - started < 30
    assert server.output().count("all requests finished") == 2, server.output()[-3000:]


def children_of(pid: int) -> set[int]:
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(proc.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (an exited orphan waits for PID 1 to reap it)."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_whose_master_was_killed_drain_and_exit(home: Path) -> None:
    """Unsupervised workers must not serve on: gthread's checked its parent; uvicorn's worker did not."""
    server = start_server(home, {"FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_LOAD_MODELS": "mlp"})
    wait_until(lambda: server.output().count(" ready: ") == 2, 60, "both workers ready")
    workers = children_of(server.process.pid)
    assert len(workers) == 2
    server.stop(signal.SIGKILL)
    try:
        wait_until(lambda: not any(running(pid) for pid in workers), 30, "the orphans to exit")
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert server.output().count("the master (pid") == 2
    assert server.output().count("all requests finished") == 2
