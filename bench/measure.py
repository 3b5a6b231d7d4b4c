"""What the benchmarks share: sample inputs, closed-loop drivers, CPU probes, result rows and their table."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.nodeload import busy_cpu_s
from serving.tensors import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
RAW_BATCHES = (1, 2, 4, 8, 16, 32)
HTTP_CONCURRENCY = (1, 8, 32)
SHED = (429, 503)  # what an overloaded server may answer instead of 200
OVERLOAD_ENV = {"FLIGHTDECK_MAX_QUEUE_SIZE": "32", "FLIGHTDECK_DEFAULT_TIMEOUT_MS": "2000"}
# name -> (model, sequence length): issue 26's workloads, for bench.peers, bench.rawort and bench.soak.
WORKLOADS = {"mlp": ("mlp", 1), "textcls32": ("textcls", 32), "textcls128": ("textcls", 128)}

# One call of a closed loop: returns (status, batch size formed or 0, back-off seconds before the next call).
Call = Callable[[], tuple[int, int, float]]


@dataclass
class Row:
    """One measurement: a row of the table."""

    label: str
    throughput: float  # samples/s
    p50_ms: float
    p99_ms: float
    batch: float  # mean samples per model execution
    errors: int = 0
    requests: int = 0
    ref: Row | None = None  # raw ORT at the batch size formed, measured right after this row
    vs_raw: float | None = None  # throughput / ref's throughput
    vs_unbatched: float | None = None  # throughput / same server with batching off, same concurrency
    cpu: tuple[float, float, float] | None = None  # % of one core: this process, server worker, everything else
    exec_busy: float | None = None  # % of the window the model executor spent computing
    batch_ms: float | None = None  # mean compute time per execution
    outside_ms: float | None = None  # mean client latency minus mean time inside the engine (HTTP, gunicorn queue)
    statuses: dict[str, int] = field(default_factory=dict)


@dataclass
class Window:
    """What a closed loop saw in its measurement window."""

    latencies: list[float]  # seconds, successful calls only
    statuses: Counter
    executions: float  # sum of 1/batch over successes: executions, when every request is one sample
    seconds: float
    before: dict[str, Any]
    after: dict[str, Any]

    def delta(self, key: str) -> float:
        return self.after[key] - self.before[key]


def sample_inputs(spec: ModelSpec, batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Return random, valid inputs for `spec` at a batch size (and sequence length where it has one)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for t in spec.inputs:
        shape = [batch] + [seq_len if axis == t.sequence_axis else max(d, 1) for axis, d in enumerate(t.shape)][1:]
        if t.dtype.kind == "f":
            tensors[t.name] = rng.standard_normal(shape).astype(t.dtype)
        elif "mask" in t.name:
            tensors[t.name] = np.ones(shape, dtype=t.dtype)
        else:
            tensors[t.name] = rng.integers(1, 1000, shape).astype(t.dtype)
    return tensors


def request_body(tensors: dict[str, np.ndarray], spec: ModelSpec) -> bytes:
    """Encode tensors as an Open Inference Protocol JSON request body."""
    inputs = [
        {"name": t.name, "shape": list(a.shape), "datatype": t.datatype, "data": a.ravel().tolist()}
        for t in spec.inputs
        for a in [tensors[t.name]]
    ]
    return json.dumps({"inputs": inputs}).encode()


def binary_request_body(tensors: dict[str, np.ndarray], spec: ModelSpec) -> tuple[bytes, int]:
    """Encode tensors with the binary tensor extension; return the body and its JSON part's length."""
    inputs, chunks = [], []
    for t in spec.inputs:
        raw = np.ascontiguousarray(tensors[t.name]).astype(t.dtype.newbyteorder("<"), copy=False).tobytes()
        shape = list(tensors[t.name].shape)
        inputs.append(
            {"name": t.name, "shape": shape, "datatype": t.datatype, "parameters": {"binary_data_size": len(raw)}}
        )
        chunks.append(raw)
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(chunks), len(header)


def grpc_request(tensors: dict[str, np.ndarray], spec: ModelSpec, model: str) -> bytes:
    """Encode tensors as a serialized ModelInferRequest, every input in raw_input_contents (as tritonclient sends)."""
    from controlplane.grpcfront import oip_pb2

    request = oip_pb2.ModelInferRequest(model_name=model)
    for t in spec.inputs:
        array = np.ascontiguousarray(tensors[t.name])
        request.inputs.add(name=t.name, datatype=t.datatype, shape=array.shape)
        request.raw_input_contents.append(array.astype(t.dtype.newbyteorder("<"), copy=False).tobytes())
    return request.SerializeToString()


def serial_us(engine: Any, model: str, tensors: dict[str, np.ndarray], n: int) -> float:
    """Return the microseconds one `engine.infer` call takes on average over `n` calls in a row."""
    start = time.perf_counter()
    for _ in range(n):
        engine.infer(model, tensors)
    return (time.perf_counter() - start) / n * 1e6


def percentile_ms(latencies: list[float], q: float) -> float:
    """Return the q-th percentile of latencies (seconds) in milliseconds; NaN when there are none."""
    return float(np.percentile(latencies, q)) * 1000 if latencies else math.nan


def cpu_probe() -> dict[str, Any]:
    """Snapshot the clock, this process's CPU seconds and the whole machine's busy CPU seconds."""
    return {"t": time.perf_counter(), "cpu": time.process_time(), "busy": busy_cpu_s()}


def cpu_usage(before: dict[str, Any], after: dict[str, Any]) -> tuple[float, float, float]:
    """Return % of one core used by this process, the server worker (when probed) and everything else."""
    wall = after["t"] - before["t"]
    own = 100 * (after["cpu"] - before["cpu"]) / wall
    server = 100 * (after.get("server_cpu", 0) - before.get("server_cpu", 0)) / wall
    return own, server, 100 * (after["busy"] - before["busy"]) / wall - own - server


def closed_loop(
    calls: list[Call], warmup_s: float, seconds: float, probe: Callable[[], dict[str, Any]] = cpu_probe,
    tick: Callable[[], None] | None = None,
) -> Window:  # fmt: skip
    """Run one thread per call in a closed loop; record the calls that end inside the window after warm-up."""
    bounds = [(math.inf, math.inf)]
    stop = threading.Event()
    records: list[list[tuple[int, float, int]]] = [[] for _ in calls]

    def worker(call: Call, out: list[tuple[int, float, int]]) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            status, batch, backoff = call()
            t1 = time.perf_counter()
            if bounds[0][0] <= t1 <= bounds[0][1]:
                out.append((status, t1 - t0, batch))
            if backoff:
                time.sleep(backoff)

    threads = [threading.Thread(target=worker, args=(c, r), daemon=True) for c, r in zip(calls, records)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(warmup_s)
        before = probe()
        start = time.perf_counter()
        bounds[0] = (start, start + seconds)
        while (left := start + seconds - time.perf_counter()) > 0:
            time.sleep(min(left, 0.2))
            if tick is not None:
                tick()
        after = probe()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    flat = [r for rs in records for r in rs]
    return Window(
        latencies=[lat for status, lat, _ in flat if status == 200],
        statuses=Counter(status for status, _, _ in flat),
        executions=sum(1 / batch for status, _, batch in flat if status == 200 and batch),
        seconds=seconds, before=before, after=after,
    )  # fmt: skip


def window_row(label: str, w: Window, batch: float | None = None) -> Row:
    """Summarise a window: successes/s, their latency, other statuses as errors, and the engine's statistics."""
    executions = w.delta("executions") if "executions" in w.after else 0
    if batch is None:  # single-sample requests: samples per execution from the server's counters
        batch = w.delta("inferences") / executions if executions else math.nan
    row = Row(
        label, w.statuses.get(200, 0) / w.seconds, percentile_ms(w.latencies, 50), percentile_ms(w.latencies, 99),
        batch, errors=sum(n for s, n in w.statuses.items() if s != 200), requests=sum(w.statuses.values()),
        cpu=cpu_usage(w.before, w.after), statuses={str(s): n for s, n in sorted(w.statuses.items())},
    )  # fmt: skip
    if executions:
        row.exec_busy = 100 * w.delta("compute_s") / w.delta("t")
        row.batch_ms = 1000 * w.delta("compute_s") / executions
    if "success" in w.after and w.latencies and w.delta("success"):
        row.outside_ms = 1000 * (float(np.mean(w.latencies)) - w.delta("success_s") / w.delta("success"))
    return row


def _fmt(value: float | None, spec: str = ".2f") -> str:
    if value is None or math.isnan(value):
        return "-"
    return format(value, ".3f" if spec == ".2f" and abs(value) < 0.1 else spec)


def print_table(title: str, rows: list[Row]) -> None:
    """Print rows as a plain-text table."""
    cols = f"{'row':<20}{'samples/s':>10}{'p50 ms':>8}{'p99 ms':>8}{'batch':>6}{'errors':>7}{'raw@b/s':>10}"
    cols += f"{'vs raw@b':>9}{'vs unbat':>9}{'cpu cli/srv/oth%':>17}{'busy%':>6}{'ms/batch':>9}{'outside ms':>11}"
    print(f"\n== {title}\n{cols}\n{'-' * len(cols)}")
    for r in rows:
        cpu = "/".join(f"{v:.0f}" for v in r.cpu) if r.cpu else "-"
        print(
            f"{r.label:<20}{r.throughput:>10.1f}{_fmt(r.p50_ms):>8}{_fmt(r.p99_ms):>8}{_fmt(r.batch, '.1f'):>6}"
            f"{r.errors:>7}{_fmt(r.ref and r.ref.throughput, '.1f'):>10}{_fmt(r.vs_raw):>9}{_fmt(r.vs_unbatched):>9}"
            f"{cpu:>17}{_fmt(r.exec_busy, '.0f'):>6}{_fmt(r.batch_ms, '.1f'):>9}{_fmt(r.outside_ms, '.1f'):>11}"
        )
    noisy = [r.label for r in rows if any(x and x.cpu and x.cpu[2] > 15 for x in (r, r.ref))]
    if noisy:
        print(f"WARNING: other processes used > 15% of a core during {', '.join(noisy)}; rerun for clean numbers")
