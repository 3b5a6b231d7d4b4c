"""Benchmark part: mixed-shape traffic and bad requests through the in-process engine.

Run by `python -m bench.engine` (or alone with `--mixed-only`). Two measurements:

- an OCR-shaped convolutional model (input [-1, 3, 48, -1]) at concurrency 32, every request one
  image of a width drawn from `WIDTHS` (48..640): throughput with batching on (requests merged only
  with requests of the same width) against the same engine with batching off;
- the demo text model at concurrency 32 where one caller in 32 sends an id outside the vocabulary:
  the extra model runs bisection spends per bad request, and the throughput against all-good traffic.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.measure import Row, closed_loop, cpu_probe, sample_inputs, window_row
from serving.engine import Engine
from serving.errors import ServingError
from serving.runtime import load_session
from serving.settings import BatchingSettings, RuntimeSettings
from serving.tensors import ModelSpec

CONCURRENCY = 32
# Text-line images are resized to height 48; their widths vary with the text. Eight widths, so
# requests of one width can meet in the queue (a width seen once can only run alone).
WIDTHS = (48, 96, 160, 256, 320, 448, 512, 640)
BAD_ID = 10**9  # far outside the demo text model's 30,000-token vocabulary


@dataclass
class ShapeResults:
    """The rows of this part and the figures its summary lines print."""

    rows: list[Row]
    mixed_gain: float  # batched / unbatched throughput on mixed widths
    raw_gain: float  # raw ONNX Runtime, same widths: samples/s at the engine's mean batch / at batch 1
    bad_requests: int
    bisect_runs: int
    executions: int
    bad_gain: float  # throughput with 1 bad caller in 32 / all good


def ocr_model() -> onnx.ModelProto:
    """Build a small text-recognition-shaped CNN: [-1, 3, 48, -1] -> [-1, 32, width / 4]."""
    rng = np.random.default_rng(7)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("ReduceMean", ["r2"], ["y"], axes=[2], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "ocr",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 48, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32, "columns"])],
        initializer=[weight("w1", (16, 3, 3, 3)), weight("w2", (32, 16, 3, 3))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_ocr_model(version_dir: Path) -> Path:
    """Write the OCR-shaped model and its manifest into `version_dir`; return the folder."""
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.onnx").write_bytes(ocr_model().SerializeToString())
    manifest = {
        "name": "ocr",
        "version": "1",
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 48, -1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 32, -1]}],
        "batching": {"max_batch_size": 32},
        "metadata": {"description": "Benchmark model: text-line images of height 48 and any width."},
    }
    (version_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return version_dir


def raw_gain(version_dir: Path, batch: int, seconds: float, rounds: int = 3) -> float:
    """Return raw ORT's samples/s at `batch` over its samples/s at batch 1, every width in turn, one caller.

    The two sizes alternate in `rounds` parts, so the machine's drift hits both alike.
    """
    session = load_session(version_dir / "model.onnx", RuntimeSettings())
    rng = np.random.default_rng(1)
    inputs = {b: [{"x": rng.standard_normal((b, 3, 48, w)).astype(np.float32)} for w in WIDTHS] for b in (1, batch)}
    samples = dict.fromkeys(inputs, 0)
    spent = dict.fromkeys(inputs, 0.0)
    for requests in inputs.values():
        for tensors in requests:
            session.run(tensors)
    for _ in range(rounds):
        for b, requests in inputs.items():
            runs, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds / (2 * rounds) or runs < len(requests):
                session.run(requests[runs % len(requests)])
                runs += 1
            samples[b] += b * runs
            spent[b] += elapsed
    return (samples[batch] / spent[batch]) / (samples[1] / spent[1])


def _engine_loop(
    version_dir: Path,
    requests: list[dict[str, np.ndarray]],
    batching: BatchingSettings,
    warmup_s: float,
    seconds: float,
) -> tuple[Row, dict[str, int]]:
    """Closed loop of CONCURRENCY callers, caller i sending requests[i]; the row and the batcher's counters."""
    engine = Engine(batching=batching)
    loaded = engine.load(version_dir, "blue")

    def caller(tensors: dict[str, np.ndarray]):
        def call() -> tuple[int, int, float]:
            try:
                return 200, engine.infer(loaded.spec.name, tensors).batch_size, 0.0
            except ServingError as exc:
                return exc.status, 0, 0.01 if exc.status in (429, 503) else 0.0

        return call

    def probe() -> dict[str, Any]:
        stats = loaded.batcher.stats  # one consistent copy per probe
        return {
            **cpu_probe(),
            "compute_s": stats.compute_ns / 1e9,
            "executions": stats.execution_count,
            "bisect_runs": stats.bisect_runs,
            "client_errors": stats.client_errors,
        }

    try:
        w = closed_loop([caller(t) for t in requests], warmup_s, seconds, probe)
    finally:
        engine.drain(30)
    mode = "batched" if batching.enabled else "unbatched"
    row = window_row(f"engine c={CONCURRENCY} {mode}", w, len(w.latencies) / w.executions if w.executions else math.nan)
    counters = {k: int(w.delta(k)) for k in ("executions", "bisect_runs", "client_errors")}
    return row, counters


def bench_shapes(store: Path, text_dir: Path, warmup_s: float, seconds: float) -> ShapeResults:
    """Measure mixed widths batched vs unbatched, and the cost of one bad caller in 32; print the results."""
    ocr_dir = write_ocr_model(store / "ocr" / "1")
    rng = np.random.default_rng(0)
    images = [
        {"x": rng.standard_normal((1, 3, 48, WIDTHS[i % len(WIDTHS)])).astype(np.float32)} for i in range(CONCURRENCY)
    ]
    print(f"[ocr] mixed widths {WIDTHS[0]}..{WIDTHS[-1]}, c={CONCURRENCY}, batching on, then off ...", flush=True)
    batched, _ = _engine_loop(ocr_dir, images, BatchingSettings(), warmup_s, seconds)
    unbatched, _ = _engine_loop(ocr_dir, images, BatchingSettings(enabled=False), warmup_s, seconds)
    batched.label, unbatched.label = f"ocr {batched.label}", f"ocr {unbatched.label}"
    mixed_gain = batched.throughput / unbatched.throughput if unbatched.throughput else math.nan
    batched.vs_unbatched = mixed_gain
    raw = raw_gain(ocr_dir, max(1, round(batched.batch)), seconds) if batched.batch > 1 else math.nan

    text_spec = ModelSpec.from_manifest(json.loads((text_dir / "manifest.json").read_text()))
    good = [sample_inputs(text_spec, 1, 16, seed=i) for i in range(CONCURRENCY)]
    bad = [dict(t) for t in good]
    bad[0] = {**good[0], "input_ids": good[0]["input_ids"].copy()}
    bad[0]["input_ids"][0, -1] = BAD_ID
    print(f"[textcls] c={CONCURRENCY}, all good, then 1 caller in {CONCURRENCY} sending a bad id ...", flush=True)
    clean, _ = _engine_loop(text_dir, good, BatchingSettings(), warmup_s, seconds)
    dirty, counters = _engine_loop(text_dir, bad, BatchingSettings(), warmup_s, seconds)
    clean.label, dirty.label = "textcls all good", f"textcls 1/{CONCURRENCY} bad"
    bad_gain = dirty.throughput / clean.throughput if clean.throughput else math.nan
    return ShapeResults(
        rows=[batched, unbatched, clean, dirty],
        mixed_gain=mixed_gain,
        raw_gain=raw,
        bad_requests=counters["client_errors"],
        bisect_runs=counters["bisect_runs"],
        executions=counters["executions"],
        bad_gain=bad_gain,
    )


def summary_lines(r: ShapeResults) -> list[str]:
    """Return the part's figures as plain lines."""
    per_bad = r.bisect_runs / r.bad_requests if r.bad_requests else math.nan
    bound = 2 * math.ceil(math.log2(CONCURRENCY))
    dirty = r.rows[3]
    return [
        f"mixed widths: batched / unbatched throughput = {r.mixed_gain:.2f} x "
        f"(mean batch {r.rows[0].batch:.1f} vs {r.rows[1].batch:.1f}); raw ORT on the same widths gains "
        f"{r.raw_gain:.2f} x from batch 1 to {round(r.rows[0].batch)}",
        f"bisection: {r.bad_requests} bad requests cost {r.bisect_runs} extra runs = {per_bad:.1f} per bad request "
        f"(bound 2 x log2({CONCURRENCY}) = {bound}); {r.executions} batches ran; statuses {dirty.statuses}",
        f"bisection: throughput with 1 bad caller in {CONCURRENCY} / all good = {r.bad_gain:.2f} x",
    ]
