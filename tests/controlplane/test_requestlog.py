"""Structured request lines: errors and slow requests always, the rest sampled, never raw input."""

from __future__ import annotations

import json
import logging

import numpy as np

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


def test_errors_and_slow_requests_are_always_logged_others_by_sample(caplog) -> None:
    caplog.set_level(logging.INFO, logger="flightdeck.requests")
    record = {"request_id": "never-sampled", "model": "mlp"}
    log_request(record, status=200, total_ms=5, sample_rate=0.0, slow_ms=1000)
    assert caplog.records == []
    log_request(record, status=400, total_ms=5, sample_rate=0.0, slow_ms=1000)
    log_request(record, status=200, total_ms=1500, sample_rate=0.0, slow_ms=1000)
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [(line["status"], line["total_ms"]) for line in lines] == [(400, 5), (200, 1500)]
    assert caplog.records[1].levelno == logging.WARNING


def test_served_requests_write_one_line_each_with_stage_timings(client, app) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.125] * 64}]}
    response = client.post("/v2/models/mlp/infer", json=body, headers={"X-Request-ID": "trace-me-1"})
    assert response.status_code == 200
    log_file = app.extensions["flightdeck"].settings.log_dir / "requests.log"
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    mine = [line for line in lines if line["request_id"] == "trace-me-1"]
    assert len(mine) == 1
    line = mine[0]
    assert (line["model"], line["version"], line["slot"], line["batch_size"], line["status"]) == (
        "mlp",
        "1",
        "blue",
        1,
        200,
    )
    assert {"decode_ms", "queue_ms", "compute_ms", "total_ms", "input_hash"} <= set(line)
    assert "0.125" not in log_file.read_text()  # the input itself is never written
