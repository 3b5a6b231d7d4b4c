"""Benchmark: publicly released ONNX models through the in-process engine, batching on against batching off.

`python -m bench.public [--seconds 3] [--warmup 1]` (part of `make bench`) runs, at
concurrency 32, each model of the pinned wheels the tests serve (`make install` puts them in the
virtual environment with `pip install --no-deps`):

- RapidOCR's text-line direction classifier, crops 48 high and 48..640 wide (mixed shapes: requests
  merge only with requests of the same width);
- RapidOCR's PP-OCRv4 text detector, pages 32..160 high and 32..320 wide (both sides vary);
- Magika's content-type classifier, INT32 byte features [-1, 2048] (one shape: every request may merge);
- Silero VAD, stateful with a scalar input and `max_batch_size: 0` (never merged: both rows should match).

It prints one table and a ratio per model; the exit code is 0 whatever the numbers say. Bisection's
cost is measured by `bench.engine` (a bad request needs a model that fails on a value, e.g. an
out-of-vocabulary id; these four refuse bad input by shape, so a bad request never shares a batch).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure import Row, closed_loop, cpu_probe, print_table, window_row
from serving.engine import Engine
from serving.errors import ServingError
from serving.settings import BatchingSettings

CONCURRENCY = 32
Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class Subject:
    """One public model: where its file is, its manifest's signature, and a request maker."""

    name: str
    distribution: str  # pinned in the Makefile's PUBLIC_MODEL_WHEELS
    member: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    max_batch_size: int
    request: Callable[[int], Tensors]  # request i of the closed loop's caller i


def _image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    return rng.standard_normal((1, 3, height, width)).astype(np.float32)


def _line(i: int) -> Tensors:
    widths = (48, 57, 96, 160, 192, 250, 320, 481, 640)
    return {"x": _image(np.random.default_rng(i), 48, widths[i % len(widths)])}


def _page(i: int) -> Tensors:
    return {"x": _image(np.random.default_rng(i), 32 * (1 + i % 5), 32 * (1 + (7 * i) % 10))}


def _file(i: int) -> Tensors:
    return {"bytes": np.random.default_rng(i).integers(0, 257, (1, 2048)).astype(np.int32)}


def _chunk(i: int) -> Tensors:
    rate, samples = (16000, 512) if i % 2 else (8000, 256)  # the chunk sizes Silero VAD takes
    audio = 0.1 * np.random.default_rng(i).standard_normal((1, samples)).astype(np.float32)
    return {"input": audio, "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(rate, np.int64)}


def _tensor(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


SUBJECTS = (
    Subject("ocr-line-direction", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            [_tensor("x", "FP32", [-1, 3, -1, -1])], [_tensor("save_infer_model/scale_0.tmp_1", "FP32", [-1, 2])], 32, _line),
    Subject("ocr-det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            [_tensor("x", "FP32", [-1, 3, -1, -1])], [_tensor("sigmoid_0.tmp_0", "FP32", [-1, 1, -1, -1])], 32, _page),
    Subject("magika", "magika", "magika/models/standard_v3_3/model.onnx",
            [_tensor("bytes", "INT32", [-1, 2048])], [_tensor("target_label", "FP32", [-1, 214])], 32, _file),
    Subject("silero-vad", "silero-vad", "silero_vad/data/silero_vad.onnx",
            [_tensor("input", "FP32", [-1, -1]), _tensor("state", "FP32", [2, -1, 128]), _tensor("sr", "INT64", [])],
            [_tensor("output", "FP32", [-1, 1]), _tensor("stateN", "FP32", [-1, -1, -1])], 0, _chunk),
)  # fmt: skip


def model_file(subject: Subject) -> Path | None:
    """Return the installed .onnx file, or None when its wheel is not installed."""
    try:
        files = importlib.metadata.files(subject.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())) for f in files if str(f) == subject.member]
    return found[0] if found else None


def write_version(subject: Subject, onnx_file: Path, folder: Path) -> Path:
    """Lay out a version folder (the model linked, a manifest written) for Engine.load."""
    version_dir = folder / subject.name / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.onnx").symlink_to(onnx_file)
    manifest = {"name": subject.name, "version": "1", "platform": "onnxruntime_onnx", "inputs": subject.inputs,
                "outputs": subject.outputs, "batching": {"max_batch_size": subject.max_batch_size}}  # fmt: skip
    (version_dir / "manifest.json").write_text(json.dumps(manifest))
    return version_dir


def measure(version_dir: Path, subject: Subject, batching: BatchingSettings, warmup_s: float, seconds: float) -> Row:
    """Closed loop of CONCURRENCY callers through one engine; return the row."""
    engine = Engine(batching=batching)
    loaded = engine.load(version_dir, "blue")

    def caller(tensors: Tensors) -> Callable[[], tuple[int, int, float]]:
        def call() -> tuple[int, int, float]:
            try:
                return 200, engine.infer(subject.name, tensors).batch_size, 0.0
            except ServingError as exc:
                return exc.status, 0, 0.01 if exc.status in (429, 503) else 0.0

        return call

    def probe() -> dict[str, Any]:
        stats = loaded.batcher.stats  # one consistent copy per probe
        return {**cpu_probe(), "compute_s": stats.compute_ns / 1e9, "executions": stats.execution_count}

    try:
        window = closed_loop([caller(subject.request(i)) for i in range(CONCURRENCY)], warmup_s, seconds, probe)
    finally:
        engine.drain(30)
    mean_batch = len(window.latencies) / window.executions if window.executions else math.nan
    mode = "batched" if batching.enabled else "unbatched"
    return window_row(f"{subject.name[:11]} {mode}", window, mean_batch)


def run(warmup_s: float, seconds: float) -> tuple[list[Row], dict[str, float]]:
    """Measure every installed subject batched and unbatched; print the table, return the rows and ratios."""
    rows: list[Row] = []
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="flightdeck-bench-public-") as tmp:
        for subject in SUBJECTS:
            onnx_file = model_file(subject)
            if onnx_file is None:
                print(f"[{subject.name}] {subject.distribution} is not installed: run `make install`", flush=True)
                continue
            version_dir = write_version(subject, onnx_file, Path(tmp))
            print(f"[{subject.name}] c={CONCURRENCY}, batching on, then off ...", flush=True)
            on = measure(version_dir, subject, BatchingSettings(), warmup_s, seconds)
            off = measure(version_dir, subject, BatchingSettings(enabled=False), warmup_s, seconds)
            on.vs_unbatched = ratios[subject.name] = on.throughput / off.throughput if off.throughput else math.nan
            rows += [on, off]
    print_table(f"public models through the engine, c={CONCURRENCY}", rows)
    for name, ratio in ratios.items():
        print(f"{name}: batched / unbatched throughput = {ratio:.2f} x")
    return rows, ratios


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per row")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up before each window")
    args = parser.parse_args(argv)
    run(args.warmup, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
