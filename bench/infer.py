"""The engine's own cost per request: `Engine.infer` against a bare `Session.run`, one caller, in-process.

`python -m bench.infer [--model mlp] [--calls 20000]` prints µs of wall time and of CPU
per call for a bare ONNX Runtime run and for `Engine.infer` (validation, routing, the batcher, stats),
and their difference: what the engine adds to a lightly loaded request.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.measure import sample_inputs
from serving.demo_models import write_demo_models
from serving.engine import Engine, read_manifest
from serving.tensors import ModelSpec


def per_call_us(call: Callable[[], object], calls: int, rounds: int = 5) -> tuple[float, float]:
    """Return the best round's (wall µs, CPU µs) per call; the best, because other load only adds."""
    for _ in range(min(200, calls)):
        call()
    best_wall = best_cpu = float("inf")
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls // rounds):
            call()
        n = calls // rounds
        best_wall = min(best_wall, (time.perf_counter() - wall) / n * 1e6)
        best_cpu = min(best_cpu, (time.process_time() - cpu) / n * 1e6)
    return best_wall, best_cpu


def measure(version_dir: Path, calls: int) -> dict[str, tuple[float, float]]:
    """Measure a bare session run and `Engine.infer` of one batch-1 sample on one loaded version."""
    spec = ModelSpec.from_manifest(read_manifest(version_dir))
    engine = Engine()
    loaded = engine.load(version_dir, "blue")
    tensors = sample_inputs(spec, 1, 16)
    try:
        return {
            "session.run": per_call_us(lambda: loaded.session.run(tensors), calls),
            "Engine.infer": per_call_us(lambda: engine.infer(spec.name, tensors), calls),
        }
    finally:
        engine.drain(30)


def main(argv: list[str] | None = None) -> int:
    """Print µs per call of a bare run and of `Engine.infer`."""
    parser = argparse.ArgumentParser(prog="python -m bench.infer", description=__doc__)
    parser.add_argument("--model", default="mlp", choices=["mlp", "textcls"])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flightdeck-bench-infer-") as tmp:
        write_demo_models(Path(tmp))
        results = measure(Path(tmp) / args.model / "1", args.calls)
    for label, (wall, cpu) in results.items():
        print(f"{label:<14} {wall:8.1f} µs wall {cpu:8.1f} µs CPU per call")
    (raw_wall, raw_cpu), (eng_wall, eng_cpu) = results["session.run"], results["Engine.infer"]
    print(f"{'engine adds':<14} {eng_wall - raw_wall:8.1f} µs wall {eng_cpu - raw_cpu:8.1f} µs CPU per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
