"""Structured request lines: errors and slow requests always, the rest sampled, never raw input, written once."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np

from controlplane.config import load_settings
from controlplane.logconfig import configure_logging
from controlplane.requestlog import input_hash, log_request, sampled


def test_sampling_is_a_stable_function_of_the_request_id() -> None:
    ids = [f"req-{i}" for i in range(4000)]
    chosen = [i for i in ids if sampled(i, 0.25)]
    assert 0.22 < len(chosen) / len(ids) < 0.28
    assert chosen == [i for i in ids if sampled(i, 0.25)]
    assert all(sampled(i, 1.0) for i in ids[:10]) and not any(sampled(i, 0.0) for i in ids[:100])


def test_input_hash_identifies_inputs_without_revealing_them() -> None:
    a = {"x": np.arange(6, dtype=np.int64).reshape(2, 3)}
    assert input_hash(a) == input_hash({"x": np.arange(6, dtype=np.int64).reshape(2, 3)})
    assert input_hash(a) != input_hash({"x": np.arange(6, dtype=np.int64).reshape(3, 2)})
    assert len(input_hash(a)) == 16


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_errors_and_slow_requests_are_always_logged_others_by_sample(tmp_path: Path, capfd) -> None:
    settings = load_settings(environ={}, overrides={"home": str(tmp_path)})
    configure_logging(settings)
    log_file = settings.log_dir / "requests.log"
    record = {"request_id": "never-sampled", "model": "mlp", "version": None}
    log_request(record, status=200, total_ms=5, sample_rate=0.0, slow_ms=1000)
    assert _lines(log_file) == []
    log_request(record, status=400, total_ms=5, sample_rate=0.0, slow_ms=1000)
    log_request({**record, "version": "2", "slot": "green"}, status=200, total_ms=1500, sample_rate=0.0, slow_ms=1000)
    lines = _lines(log_file)
    assert [(line["status"], line["total_ms"], line["level"]) for line in lines] == [
        (400, 5, "INFO"),
        (200, 1500, "WARNING"),
    ]
    assert (lines[0]["version"], lines[0]["slot"]) == (None, None)  # refused before it was routed
    assert (lines[1]["version"], lines[1]["slot"]) == ("2", "green")
    assert all(datetime.fromisoformat(line["timestamp"]).utcoffset().total_seconds() == 0 for line in lines)
    assert lines[0]["timestamp"].endswith("Z") and list(lines[0])[:3] == ["timestamp", "level", "request_id"]
    assert "never-sampled" not in capfd.readouterr().err  # the file only: no copy on the terminal


def test_served_requests_write_one_line_each_with_stage_timings(client, app) -> None:
    body = {
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.3671875] * 64}]
    }  # 7 decimals: no timing (3) can read so
    response = client.post("/v2/models/mlp/infer", json=body, headers={"X-Request-ID": "trace-me-1"})
    assert response.status_code == 200
    log_file = app.extensions["flightdeck"].settings.log_dir / "requests.log"
    mine = [line for line in _lines(log_file) if line["request_id"] == "trace-me-1"]
    assert len(mine) == 1
    line = mine[0]
    assert (line["model"], line["version"], line["slot"], line["batch_size"], line["status"], line["level"]) == (
        "mlp",
        "1",
        "blue",
        1,
        200,
        "INFO",
    )
    assert {"timestamp", "decode_ms", "queue_ms", "compute_ms", "total_ms", "input_hash"} <= set(line)
    assert "0.3671875" not in log_file.read_text()  # the input itself is never written


def test_a_refused_request_names_the_version_and_slot_that_refused_it(client, app) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 63], "datatype": "FP32", "data": [0.5] * 63}]}
    response = client.post("/v2/models/mlp/infer", json=body, headers={"X-Request-ID": "bad-shape"})
    assert response.status_code == 400
    unknown = client.post("/v2/models/nosuch/infer", json=body, headers={"X-Request-ID": "no-model"})
    assert unknown.status_code == 404
    lines = {
        line["request_id"]: line for line in _lines(app.extensions["flightdeck"].settings.log_dir / "requests.log")
    }
    refused = lines["bad-shape"]
    assert (refused["version"], refused["slot"], refused["status"]) == ("1", "blue", 400)
    assert "shape [1, 63]" in refused["error"]
    assert (lines["no-model"]["version"], lines["no-model"]["slot"], lines["no-model"]["status"]) == (None, None, 404)
