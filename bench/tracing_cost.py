"""What OpenTelemetry tracing costs an inference request: off, sampled at 1 %, at 100 %, and without its code.

`python -m bench.tracing_cost [--calls 3000] [--repeats 4]` serves the demo mlp in-process, one
caller, through `inference.serve` (the request's whole life: admission, decode, the batcher, the run,
encode, the log decision) and prints µs of wall time and of CPU per request for:
- `no tracing code`: the same loop on the product as it was before tracing came (`--baseline-ref`,
  by default the parent of the commit that added controlplane/tracing.py, taken with `git archive`);
- `off`: this tree, no OTEL_* variable set (how it ships);
- `1 %` and `100 %`: this tree exporting over OTLP/HTTP to a sink on 127.0.0.1 that answers at once,
  `OTEL_TRACES_SAMPLER=traceidratio` with the ratio as its argument (requests carry no traceparent).
Each configuration runs in a fresh process at the same time as a run of `no tracing code` (so both
see the same load from the rest of the machine), `--repeats` times; printed: the best µs of each, and
the median over its pairs of its ratio to the run beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("no tracing code", "off", "1 %", "100 %")
SAMPLING = {"1 %": "0.01", "100 %": "1.0"}


class _Sink(BaseHTTPRequestHandler):
    """Answers every OTLP export at once with an empty success."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def baseline_tree(ref: str | None, into: Path) -> Path | None:
    """Extract the product's packages as they were at `ref` (default: before tracing came); None without git."""
    try:
        if ref is None:
            added = subprocess.run(
                ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--", "controlplane/tracing.py"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            if not added:
                return None
            ref = f"{added[-1]}^"
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "controlplane", "serving", "alerts", "dashboards"],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def worker(mode: str, models: Path, calls: int) -> None:
    """Serve `calls` requests in this process and print `wall cpu` µs per request (the best of 5 rounds)."""
    import json

    from bench.infer import per_call_us
    from bench.measure import request_body, sample_inputs
    from controlplane import inference
    from controlplane.config import load_settings
    from serving.engine import Engine, read_manifest
    from serving.tensors import ModelSpec

    with tempfile.TemporaryDirectory(prefix="flightdeck-bench-tracing-") as home:
        settings = load_settings(environ={}, overrides={"home": home, "log_sample_rate": 0.0})
        traced: list = []
        if mode != "no tracing code":
            from controlplane import tracing

            configured = tracing.configure("bench")
            traced = [] if configured is None else [configured]
            assert (configured is None) == (mode == "off"), (
                f"{mode}: tracing is {'off' if configured is None else 'on'}"
            )
            engine = Engine(
                settings.runtime, settings.batching_settings, tracer_factory=configured and configured.batch_tracer
            )
        else:
            engine = Engine(settings.runtime, settings.batching_settings)
        version_dir = models / "mlp" / "1"
        spec = ModelSpec.from_manifest(read_manifest(version_dir))
        engine.load(version_dir, "blue")
        body = request_body(sample_inputs(spec, 1, 16), spec)
        headers: dict[str, str] = {}
        # NOTE: the baseline's `serve` has no tracing argument; this tree's takes it last.
        extra = [traced[0] if traced else None] if mode != "no tracing code" else []

        def one() -> object:
            answer = inference.serve(engine, settings, "mlp", None, "bench", headers.get, lambda _limit: body, *extra)
            assert answer.status == 200, answer.body
            return answer

        wall, cpu = per_call_us(one, calls)
        if traced:
            traced[0].shutdown()
        engine.drain(30)
        print(json.dumps({"mode": mode, "wall": wall, "cpu": cpu, "code": inference.__file__}))


def run_together(
    modes: list[str], models: Path, calls: int, baseline: Path | None, sink: str
) -> list[tuple[float, float]]:
    """Run one worker process per mode, all at once (they share whatever else loads the machine); their results."""
    started = [(mode, _start(mode, models, calls, baseline, sink)) for mode in modes]
    return [_result(mode, process, baseline) for mode, process in started]


def _start(mode: str, models: Path, calls: int, baseline: Path | None, sink: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    path = [str(ROOT)] if mode != "no tracing code" else [str(baseline), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if mode in SAMPLING:
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=sink, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG=SAMPLING[mode]
        )
    return subprocess.Popen(
        [sys.executable, "-m", "bench.tracing_cost", "--worker", mode, "--models", str(models), "--calls", str(calls)],
        env=env,
        cwd=baseline if mode == "no tracing code" else ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(mode: str, process: subprocess.Popen, baseline: Path | None) -> tuple[float, float]:
    import json

    out, err = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"the '{mode}' worker failed:\n{err}")
    result = json.loads(out.strip().splitlines()[-1])
    expected = str(baseline) if mode == "no tracing code" else str(ROOT)
    assert result["code"].startswith(expected), f"{mode} ran {result['code']}, not the code under {expected}"
    return result["wall"], result["cpu"]


def main(argv: list[str] | None = None) -> int:
    """Print µs per request and the ratios to the product without tracing code."""
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--baseline-ref", default=None, help="git revision without tracing (default: found by git log)")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--models", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.models, args.calls)
        return 0

    from serving.demo_models import write_demo_models

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sink = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory(prefix="flightdeck-bench-tracing-") as tmp:
            models = Path(tmp) / "models"
            write_demo_models(models)
            (Path(tmp) / "base").mkdir()
            baseline = baseline_tree(args.baseline_ref, Path(tmp) / "base")
            modes = [m for m in MODES if baseline is not None or m != "no tracing code"]
            if baseline is None:
                print("no git history here: 'no tracing code' is left out; the ratios are to 'off'")
            reference = modes[0]
            best: dict[str, tuple[float, float]] = {}
            ratios: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes[1:]}
            started = time.perf_counter()
            # NOTE: each configuration runs at the same time as a run of the reference, so both see the same
            # load from the rest of the machine; the ratio of each such pair is what is compared.
            for _ in range(args.repeats):
                for mode in modes[1:]:
                    (ref_wall, ref_cpu), (wall, cpu) = run_together(
                        [reference, mode], models, args.calls, baseline, sink
                    )
                    ratios[mode].append((wall / ref_wall, cpu / ref_cpu))
                    for m, (w, c) in ((reference, (ref_wall, ref_cpu)), (mode, (wall, cpu))):
                        old = best.get(m, (float("inf"), float("inf")))
                        best[m] = (min(old[0], w), min(old[1], c))
    finally:
        server.shutdown()
        server.server_close()
    print(
        f"mlp, batch 1, one caller, inference.serve; {args.repeats} pairs per configuration, each run beside a run "
        f"of '{reference}'; best µs of each; ratios: median of the pairs' (5 rounds of {args.calls // 5} calls)"
    )
    print(f"{'tracing':<16} {'µs wall':>9} {'µs CPU':>9} {'wall / ' + reference:>24} {'CPU / ' + reference:>24}")
    for mode in modes:
        wall, cpu = best[mode]
        pairs = ratios.get(mode, [(1.0, 1.0)])
        wall_ratio = statistics.median(r[0] for r in pairs)
        cpu_ratio = statistics.median(r[1] for r in pairs)
        print(f"{mode:<16} {wall:9.1f} {cpu:9.1f} {wall_ratio:24.3f} {cpu_ratio:24.3f}")
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
