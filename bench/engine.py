"""Benchmark: raw ONNX Runtime vs the in-process engine vs the real HTTP server, per demo model.

`python -m bench.engine [--models textcls,mlp] [--seconds 5] [--seq-len 64] [--quick] [--json PATH]`
prints a table per model and PASS/FAIL lines for the text model's targets, then mixed-shape traffic
and bad requests through the engine (bench.shapes; `--mixed-only` runs just that part,
`--no-mixed` skips it). The exit code is 0
whatever the numbers say; it is non-zero only when the benchmark itself crashed.

Columns: raw@b/s is raw ORT at the batch size a row formed, measured right after it (this machine's
speed drifts); cpu is % of one core used by this process (the client), the server's worker, and
anything else (noise: rerun when it is high); busy% is the share of time the model executor spent
computing, ms/batch its mean compute per execution, outside ms the mean client latency not spent
inside the engine (HTTP handling and gunicorn's own queue).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure import (
    HTTP_CONCURRENCY,
    OVERLOAD_ENV,
    RAW_BATCHES,
    ROOT,
    SHED,
    Call,
    Row,
    closed_loop,
    cpu_probe,
    cpu_usage,
    percentile_ms,
    print_table,
    request_body,
    sample_inputs,
    window_row,
)
from bench.process import ServerProcess, free_port
from serving.demo_models import DEMO_MODELS, write_demo_models
from serving.engine import Engine, read_manifest
from serving.errors import ServingError
from serving.nodeload import CLK_TCK
from serving.runtime import Session, load_session
from serving.settings import BatchingSettings, RuntimeSettings, parallelism
from serving.tensors import ModelSpec


def bench_raw(
    session: Session, spec: ModelSpec, batches: list[int], seq_len: int, seconds: float, rounds: int = 3
) -> list[Row]:
    """Closed-loop, single-caller ONNX Runtime per batch size, round-robin in `rounds` parts so drift hits all alike.

    Throughput is the median of a batch size's parts; `seconds` is the time per batch size.
    """  # fmt: skip
    inputs = {b: sample_inputs(spec, b, seq_len) for b in batches}
    latencies: dict[int, list[float]] = {b: [] for b in batches}
    rates: dict[int, list[float]] = {b: [] for b in batches}
    cpu = {b: np.zeros(3) for b in batches}
    for b in batches:
        for _ in range(3):
            session.run(inputs[b])
    for _ in range(rounds):
        for b in batches:
            before, n = cpu_probe(), 0
            while time.perf_counter() < before["t"] + seconds / rounds or n < 3:
                t0 = time.perf_counter()
                session.run(inputs[b])
                latencies[b].append(time.perf_counter() - t0)
                n += 1
            after = cpu_probe()
            rates[b].append(b * n / (after["t"] - before["t"]))
            cpu[b] += np.array(cpu_usage(before, after)) / rounds
    rows = []
    for b in batches:
        lat = latencies[b]
        median, (own, server, other) = float(np.median(rates[b])), cpu[b]
        row = Row(f"raw b={b}", median, percentile_ms(lat, 50), percentile_ms(lat, 99), b, 0, len(lat))
        row.cpu = (own, server, other)
        rows.append(row)
    return rows


class RawRuns:
    """Raw ONNX Runtime (default RuntimeSettings, one caller) for one model: a sweep, and references on demand."""

    def __init__(self, version_dir: Path, spec: ModelSpec, seq_len: int, seconds: float) -> None:
        self.version_dir = version_dir
        self.session = load_session(version_dir / "model.onnx", RuntimeSettings())
        self.spec, self.seq_len, self.seconds = spec, seq_len, seconds
        self.sweep = {r.batch: r for r in bench_raw(self.session, spec, list(RAW_BATCHES), seq_len, seconds)}

    def measure(self, batch: float) -> Row:
        """Measure now at round(batch), clamped to 1..32."""
        b = 1 if math.isnan(batch) else max(1, min(RAW_BATCHES[-1], round(batch)))
        return bench_raw(self.session, self.spec, [b], self.seq_len, self.seconds)[0]

    def same_settings_b1(self) -> tuple[int, Row]:
        """Measure raw batch 1 with the intra-op threads the engine gives each executor by default."""
        _, threads = parallelism(RuntimeSettings(), BatchingSettings(), on_gpu=False)
        session = load_session(self.version_dir / "model.onnx", RuntimeSettings(intra_op_threads=threads))
        return threads, bench_raw(session, self.spec, [1], self.seq_len, self.seconds)[0]

    def compare(self, row: Row) -> Row:
        """Measure raw ORT at the batch size `row` formed, now (the machine's speed drifts), and set row.vs_raw."""
        row.ref = self.measure(row.batch)
        row.vs_raw = row.throughput / row.ref.throughput
        return row

    def best(self) -> Row:
        """Return the sweep's highest-throughput row."""
        return max(self.sweep.values(), key=lambda r: r.throughput)


def bench_engine(
    version_dir: Path, spec: ModelSpec, seq_len: int, threads: int, warmup_s: float, seconds: float
) -> Row:
    """The in-process engine (default settings, blue slot) at saturation: `threads` callers of single samples."""
    engine = Engine()
    batcher = engine.load(version_dir, "blue").batcher
    tensors = sample_inputs(spec, 1, seq_len)

    def call() -> tuple[int, int, float]:
        try:
            return 200, engine.infer(spec.name, tensors).batch_size, 0.0
        except ServingError as exc:
            return exc.status, 0, 0.01

    def probe() -> dict[str, Any]:
        stats = batcher.stats  # one consistent copy per probe
        return {**cpu_probe(), "compute_s": stats.compute_ns / 1e9, "executions": stats.execution_count}

    try:
        w = closed_loop([call] * threads, warmup_s, seconds, probe)
    finally:
        engine.drain(30)
    return window_row(f"engine c={threads}", w, len(w.latencies) / w.executions if w.executions else math.nan)


class Server(ServerProcess):
    """The real gunicorn server (Flightdeck's gunicorn.conf.py) over a temporary home linking the demo models."""

    def __init__(self, store: Path, home: Path, overrides: dict[str, str] | None = None) -> None:
        for version_dir in sorted(p for p in store.glob("*/*") if p.is_dir()):
            target = home / "models" / version_dir.parent.name / version_dir.name
            target.mkdir(parents=True, exist_ok=True)
            for item in version_dir.iterdir():
                (target / item.name).symlink_to(item)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTDECK_", "PROMETHEUS_MULTIPROC"))}
        env.update(
            FLIGHTDECK_HOME=str(home), FLIGHTDECK_HOST="127.0.0.1", FLIGHTDECK_PORT=str(port),
            FLIGHTDECK_LOG_SAMPLE_RATE="0", FLIGHTDECK_DEMO_MODELS="false", FLIGHTDECK_GRPC_PORT="0",
            # NOTE: one worker unless asked: this bench probes one worker's CPU, RSS and statistics.
            **{"FLIGHTDECK_WORKERS": "1", **(overrides or {})},
        )  # fmt: skip
        argv = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")]
        super().__init__("server", argv, env, port, home / "server.log")
        self._worker: int | None = None

    def worker_pid(self) -> int:
        """Return the pid of the gunicorn worker: the master's child."""
        if self._worker is None:
            children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == self.process.pid]
            if not children:
                raise RuntimeError("the gunicorn master has no worker")
            self._worker = int(children[0])
        return self._worker

    def rss_mb(self) -> float:
        """Return the worker's resident set size (VmRSS) in MiB."""
        for line in Path(f"/proc/{self.worker_pid()}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return math.nan

    def probe(self, model: str) -> dict[str, Any]:
        """Snapshot CPU (both processes) and the model's Triton-style statistics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/models/{model}/stats", timeout=30) as r:
            stats = json.load(r)["model_stats"]
        stat = Path(f"/proc/{self.worker_pid()}/stat").read_text().rsplit(")", 1)[1].split()
        return {
            **cpu_probe(), "server_cpu": (int(stat[11]) + int(stat[12])) / CLK_TCK,
            "inferences": sum(s["inference_count"] for s in stats), "executions": sum(s["execution_count"] for s in stats),
            "compute_s": sum(s["inference_stats"]["compute_infer"]["ns"] for s in stats) / 1e9,
            "success": sum(s["inference_stats"]["success"]["count"] for s in stats),
            "success_s": sum(s["inference_stats"]["success"]["ns"] for s in stats) / 1e9,
        }  # fmt: skip

    def client(self, model: str, body: bytes) -> Call:
        """Return a call POSTing `body` over its own keep-alive connection; it backs off briefly on 429/503."""
        conn: list[http.client.HTTPConnection | None] = [None]
        path, headers = f"/v2/models/{model}/infer", {"Content-Type": "application/json"}

        def call() -> tuple[int, int, float]:
            if conn[0] is None:
                conn[0] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                conn[0].request("POST", path, body, headers)
                response = conn[0].getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                conn[0].close()
                conn[0] = None
                return 0, 0, 0.01  # status 0: the connection failed
            if response.will_close:
                conn[0].close()
                conn[0] = None
            backoff = min(float(response.getheader("Retry-After") or 1), 0.05) if response.status in SHED else 0.0
            return response.status, 0, backoff

        return call


def _ppid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def bench_http(server: Server, label: str, model: str, body: bytes, threads: int, warmup_s: float, seconds: float,
               tick: Callable[[], None] | None = None) -> Row:  # fmt: skip
    """Closed-loop HTTP load of single-sample requests; the mean batch comes from the server's statistics."""
    calls = [server.client(model, body) for _ in range(threads)]
    return window_row(label, closed_loop(calls, warmup_s, seconds, lambda: server.probe(model), tick))


def bench_overload(server: Server, body: bytes, threads: int, warmup_s: float, seconds: float) -> tuple[Row, dict]:
    """Far more concurrency than capacity against a small queue: statuses, accepted latency, worker RSS."""
    rss = {"idle": server.rss_mb()}
    bench_http(server, "overload warm-up", "textcls", body, threads, 0.0, warmup_s)
    rss["warm"] = rss["peak"] = server.rss_mb()

    def tick() -> None:
        rss["peak"] = max(rss["peak"], server.rss_mb())

    row = bench_http(server, f"overload c={threads}", "textcls", body, threads, 0.5, seconds, tick)
    time.sleep(0.5)
    rss["end"] = server.rss_mb()
    row.errors = sum(n for s, n in row.statuses.items() if int(s) not in (200, *SHED))
    return row, rss


def check_targets(rows: dict[str, Row], raw: RawRuns, overload: tuple[Row, dict] | None) -> list[dict[str, Any]]:
    """Print the text model's targets as PASS/FAIL lines and return them."""
    checks: list[tuple[str, bool, str]] = []
    for key, goal in (("engine", 0.9), ("http c=32 batched", 0.75)):
        r = rows[key]
        assert r.ref is not None and r.vs_raw is not None
        detail = f"{r.throughput:.0f} samples/s vs raw b={r.ref.batch:.0f} {r.ref.throughput:.0f} = {r.vs_raw:.2f} x"
        checks.append((f"{r.label} >= {goal} x raw ORT at the batch formed", r.vs_raw >= goal, detail))
    raw_gain = raw.best().throughput / raw.sweep[1].throughput
    u32 = rows["http c=32 unbatched"].throughput
    server_gain = rows["http c=32 batched"].throughput / u32 if u32 else math.nan
    kept = (server_gain - 1) / (raw_gain - 1) if raw_gain > 1 else math.nan
    detail = (f"server c=32 batched/unbatched {server_gain:.2f} x, {raw.best().label}/b=1 {raw_gain:.2f} x; "
              f"ratio of gains {server_gain / raw_gain:.2f}, share kept {kept:.2f}")  # fmt: skip
    checks.append(("batching gain kept >= 0.7", kept >= 0.7, detail))
    h1 = rows["http c=1 batched"]
    r1 = h1.ref.p50_ms if h1.ref else raw.sweep[1].p50_ms
    checks.append(("HTTP c=1 p50 within 1.5 ms of raw b=1", h1.p50_ms - r1 <= 1.5, f"{h1.p50_ms:.2f} vs {r1:.2f} ms"))
    # The server's sessions run with fewer intra-op threads than raw's default (see serving.settings.parallelism).
    threads, same = raw.same_settings_b1()
    checks.append((f"HTTP c=1 p50 within 1.5 ms of raw b=1 on the server's session settings ({threads} thread(s))",
                   h1.p50_ms - same.p50_ms <= 1.5, f"{h1.p50_ms:.2f} vs {same.p50_ms:.2f} ms"))  # fmt: skip
    if overload is not None:
        row, rss = overload
        deadline = float(OVERLOAD_ENV["FLIGHTDECK_DEFAULT_TIMEOUT_MS"])
        shed = sum(n for s, n in row.statuses.items() if int(s) in SHED)
        checks.append(("overload: no status but 200/429/503", row.errors == 0, f"{row.statuses} (0: no connection)"))
        checks.append(("overload: the excess refused with 429/503", shed > 0, f"{shed} refused; mean {row.outside_ms:.0f} ms "
                       "per accepted request spent outside the engine (HTTP, gunicorn's queue)"))  # fmt: skip
        detail = f"{row.p99_ms:.0f} vs {deadline:.0f} ms"
        checks.append(("overload: p99 of accepted within the deadline", row.p99_ms <= deadline, detail))
        growth = rss["end"] - rss["warm"]
        detail = ", ".join(f"{k} {v:.0f}" for k, v in rss.items()) + f" MB (+{growth:.1f} MB after warm-up)"
        flat = growth < 50 or growth < 0.1 * rss["warm"]
        checks.append(("overload: worker RSS flat (< 50 MB or < 10%)", flat, detail))
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return [{"target": name, "pass": ok, "detail": detail} for name, ok, detail in checks]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="textcls,mlp", help="comma-separated demo models (default: textcls,mlp)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per load measurement; raw rows take a third")
    p.add_argument("--seq-len", type=int, default=64, help="sequence length of the text model's requests")
    p.add_argument("--engine-threads", type=int, default=64, help="caller threads for the in-process engine")
    p.add_argument("--overload-threads", type=int, default=128, help="client threads for the overload run")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra FLIGHTDECK_* setting for every server, e.g. to try a fix (repeatable)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a fast run: 1 s per measurement")
    mixed = p.add_mutually_exclusive_group()
    mixed.add_argument("--mixed-only", action="store_true", help="run only the mixed-shape and bad-request part")
    mixed.add_argument("--no-mixed", action="store_true", help="skip the mixed-shape and bad-request part")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    args = p.parse_args(argv)
    unknown = set(args.models.split(",")) - set(DEMO_MODELS)
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}; the demo models are {', '.join(DEMO_MODELS)}")
    if args.quick:
        args.seconds = 1.0
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every model and configuration, print the tables and targets, and return the results."""
    models = args.models.split(",")
    secs, warm = args.seconds, max(0.3, args.seconds / 5)
    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "models": {}}
    rows: dict[str, dict[str, Row]] = {m: {} for m in models}
    overload = None
    with tempfile.TemporaryDirectory(prefix="flightdeck-bench-") as tmp:
        store = Path(tmp) / "store"
        write_demo_models(store)
        if not args.no_mixed:
            results["mixed_shapes"] = run_mixed(store, warm, secs)
        if args.mixed_only:
            return results
        specs = {m: ModelSpec.from_manifest(read_manifest(store / m / "1")) for m in models}
        bodies = {m: request_body(sample_inputs(specs[m], 1, args.seq_len), specs[m]) for m in models}
        raws: dict[str, RawRuns] = {}
        for m in models:
            print(f"[{m}] raw ONNX Runtime, then the in-process engine ...", flush=True)
            raws[m] = RawRuns(store / m / "1", specs[m], args.seq_len, max(0.5, secs / 3))
            rows[m].update({r.label: r for r in raws[m].sweep.values()})
            engine = bench_engine(store / m / "1", specs[m], args.seq_len, args.engine_threads, warm, secs)
            rows[m]["engine"] = raws[m].compare(engine)
        extra = dict(kv.split("=", 1) for kv in args.server_env)
        servers = [("batched", {}), ("unbatched", {"FLIGHTDECK_BATCHING": "false"})]
        servers += [("overload", OVERLOAD_ENV)] if "textcls" in models else []
        for mode, env in servers:
            server = Server(store, Path(tmp) / mode, {**extra, **env})
            try:
                server.wait_ready()
                if mode == "overload":
                    print(f"[textcls] overload, {args.overload_threads} clients ...", flush=True)
                    overload = bench_overload(server, bodies["textcls"], args.overload_threads, warm, secs)
                    rows["textcls"]["overload"] = overload[0]
                    continue
                for m in models:
                    for c in HTTP_CONCURRENCY:
                        print(f"[{m}] HTTP {mode} c={c} ...", flush=True)
                        row = bench_http(server, f"http c={c} {mode}", m, bodies[m], c, warm, secs)
                        rows[m][row.label] = raws[m].compare(row)  # the server idles meanwhile
            finally:
                server.stop()
        for m in models:
            for key, row in rows[m].items():
                if key.endswith(" batched"):
                    unbatched = rows[m][key.replace(" batched", " unbatched")].throughput
                    row.vs_unbatched = row.throughput / unbatched if unbatched else math.nan
            seq = f", seq_len {args.seq_len}" if specs[m].has_sequence_axis else ""
            print_table(f"{m}{seq}, {secs:g} s per measurement", list(rows[m].values()))
            best, one = raws[m].best(), raws[m].sweep[1]
            print(f"raw limit: {best.label}, {best.throughput:.0f} samples/s; raw b=1 p50 {one.p50_ms:.3f} ms")
            results["models"][m] = {"rows": [asdict(r) for r in rows[m].values()]}
        if overload is not None:
            results["overload_rss_mb"] = overload[1]
        if "textcls" in models:
            print("\nTargets (textcls):")
            results["targets"] = check_targets(rows["textcls"], raws["textcls"], overload)
    return results


def run_mixed(store: Path, warmup_s: float, seconds: float) -> dict[str, Any]:
    """Run bench.shapes over the demo store; print its table and lines and return them."""
    from bench.shapes import bench_shapes, summary_lines  # NOTE: imports this module back

    part = bench_shapes(store, store / "textcls" / "1", warmup_s, seconds)
    print_table(f"mixed shapes and bad requests through the engine, {seconds:g} s per measurement", part.rows)
    lines = summary_lines(part)
    print("\n".join(lines))
    return {"rows": [asdict(r) for r in part.rows], "summary": lines}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 unless it crashed."""
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        results = run(args)
    except Exception:
        traceback.print_exc()
        return 1
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print(f"\nfinished in {results['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
