"""Benchmark: what history sampling costs serving throughput (`python -m bench.history_overhead`).

Runs the in-process engine at saturation on the text model, alternating rounds with no sampler
and rounds with the sampler writing to a real SQLite file ten times faster than the default
interval, and prints both throughputs and their ratio (target: under 2% lost).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from controlplane.db import make_engine, session_factory
from controlplane.history.sampler import HistorySampler
from controlplane.migrate import upgrade
from serving.demo_models import write_demo_models
from serving.engine import Engine
from serving.histogram import Histogram


def saturate(
    engine: Engine, seconds: float, callers: int, sampler: HistorySampler | None, every_s: float
) -> tuple[float, list[float]]:
    """Drive the engine with `callers` threads for `seconds`; return (samples/s, sample() durations)."""
    ids = np.ones((1, 64), dtype=np.int64)
    inputs = {"input_ids": ids, "attention_mask": ids}
    stop = threading.Event()
    done = [0] * callers
    durations: list[float] = []

    def call(i: int) -> None:
        while not stop.is_set():
            engine.infer("textcls", inputs)
            done[i] += 1

    def sample_loop() -> None:
        while not stop.wait(every_s):
            started = time.perf_counter()
            sampler.sample()
            durations.append(time.perf_counter() - started)

    with ThreadPoolExecutor(callers + 1) as pool:
        started = time.perf_counter()
        for i in range(callers):
            pool.submit(call, i)
        if sampler is not None:
            pool.submit(sample_loop)
        stop.wait(seconds)
        stop.set()
    return sum(done) / (time.perf_counter() - started), durations


def main(argv: list[str] | None = None) -> int:
    """Print throughput with and without sampling, interleaved to cancel drift."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--every", type=float, default=1.0, help="sampling interval (the default in production is 10 s)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flightdeck-overhead-") as tmp:
        store = Path(tmp) / "store"
        write_demo_models(store)
        url = f"sqlite:///{tmp}/history.db"
        upgrade(url)
        db = make_engine(url)
        engine = Engine()
        engine.load(store / "textcls" / "1")
        sampler = HistorySampler(engine, session_factory(db), process="bench")
        saturate(engine, 2.0, 64, None, args.every)  # warm up
        off, on, costs = [], [], []
        for i in range(args.rounds):
            # NOTE: pairs alternate their order so a drifting machine speed cancels out.
            for with_sampler in (False, True) if i % 2 == 0 else (True, False):
                rate, durations = saturate(engine, args.seconds, 64, sampler if with_sampler else None, args.every)
                (on if with_sampler else off).append(rate)
                costs += durations
        engine.drain(30)
        db.dispose()
    pairs = [a / b for a, b in zip(on, off, strict=True)]
    record_ns = _record_cost_ns()
    serving_cpu_ns = (os.cpu_count() or 1) * 1e9 / statistics.median(off)  # all cores, per request served
    sampling_ns = statistics.median(costs) / args.every * 1e9 / statistics.median(off)
    share = (sampling_ns + record_ns) / serving_cpu_ns
    rounds = ", ".join
    print(f"sampling every {args.every:g} s, {args.rounds} paired rounds of {args.seconds:g} s, textcls seq 64")
    print(f"  without sampler: {statistics.median(off):8.1f} samples/s  ({rounds(f'{x:.0f}' for x in off)})")
    print(f"  with sampler:    {statistics.median(on):8.1f} samples/s  ({rounds(f'{x:.0f}' for x in on)})")
    print(f"  paired ratios with/without: {rounds(f'{x:.3f}' for x in pairs)}; median {statistics.median(pairs):.3f}")
    print(
        f"  CPU accounting: one sample() costs {statistics.median(costs) * 1000:.2f} ms of CPU; a histogram record "
        f"{record_ns:.0f} ns; together {share * 100:.3f}% of the CPU one request costs to serve"
    )
    print(f"  {'PASS' if share < 0.02 else 'FAIL'}  sampling costs under 2% (at {10 / args.every:g}x the default rate)")
    return 0


def _record_cost_ns() -> float:
    """Return the CPU cost of recording one latency into a histogram."""
    histogram = Histogram()
    values = np.random.default_rng(0).lognormal(np.log(0.01), 0.8, 100_000).tolist()
    started = time.thread_time_ns()
    for value in values:
        histogram.record(value)
    return (time.thread_time_ns() - started) / len(values)


if __name__ == "__main__":
    raise SystemExit(main())
