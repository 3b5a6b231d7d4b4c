"""Batch limits from the cost curve, on and off, in one process: `python -m bench.batchlimit`.

Loads one demo model into two in-process engines with the product's parallelism: one merging up to
the max batch size, one merging up to the limits its cost curve gave at load (or `--limit N` for
every bucket, to compare a chosen size without the curve's noise). Then drives each closed-loop from
`--concurrency` threads (batch-1 requests at `--seq-len`) in short windows, alternating A B B A ...,
so that load from other processes on the cores weighs on both alike, and prints each one's
throughput, p50 and p99 over all its windows, its mean batch, and the ratios (pooled, and the median
over adjacent pairs of windows).

    python -m bench.batchlimit [--model textcls] [--seq-len 128] [--concurrency 32] [--windows 8]
                               [--seconds 2] [--limit N]

No HTTP: this isolates what the batch size does to queueing; bench.peers measures the whole server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.measure import percentile_ms, sample_inputs
from serving.demo_models import write_demo_models
from serving.engine import Engine, read_manifest
from serving.settings import BatchingSettings
from serving.tensors import ModelSpec


def drive(engine: Engine, model: str, tensors: dict, concurrency: int, seconds: float) -> tuple[list[float], float]:
    """Run `concurrency` closed-loop callers for `seconds`; return the latencies (s) and the window's length."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    stop = time.perf_counter() + seconds

    def caller(mine: list[float]) -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            engine.infer(model, tensors)
            mine.append(time.perf_counter() - started)

    started = time.perf_counter()
    threads = [threading.Thread(target=caller, args=(mine,)) for mine in latencies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [x for mine in latencies for x in mine], time.perf_counter() - started


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.batchlimit", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="textcls", choices=["textcls", "mlp"])
    p.add_argument("--seq-len", type=int, default=128, help="tokens per request (textcls)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--windows", type=int, default=8, help="windows per engine, alternating")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per window")
    p.add_argument("--limit", type=int, default=0, help="merge up to N in every bucket instead of the learned limits")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"cores: {os.cpu_count()}  load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="flightdeck-batchlimit-") as tmp:
        write_demo_models(Path(tmp))
        folder = Path(tmp) / args.model / "1"
        spec = ModelSpec.from_manifest(read_manifest(folder))
        tensors = sample_inputs(spec, 1, args.seq_len)
        engines = {"max": Engine(batching=BatchingSettings()), "limited": Engine(batching=BatchingSettings())}
        if not args.limit:
            engines["limited"] = Engine(batching=BatchingSettings(learn_batch_limits=True))
        try:
            for engine in engines.values():
                engine.load(folder)
            (limited,) = engines["limited"].loaded(args.model)
            if args.limit:
                b = limited.batcher
                buckets = spec.sequence_buckets or (0,)
                b.reconfigure(
                    max_batch_size=b.max_batch_size,
                    max_queue_delay_s=b.max_queue_delay_s,
                    max_queue_size=b.max_queue_size,
                    batch_limits=dict.fromkeys(buckets, args.limit),
                )
            print(f"limited: batch limits {limited.batcher.batch_limits}", flush=True)
            if limited.config.cost_curve is not None:
                print(f"  cost curve, ms per sample: {limited.config.cost_curve.describe()}", flush=True)
            results: dict[str, list[float]] = {name: [] for name in engines}
            spent = dict.fromkeys(engines, 0.0)
            for engine in engines.values():
                drive(engine, args.model, tensors, args.concurrency, min(1.0, args.seconds))  # warm both alike
            order = ["max", "limited", "limited", "max"]
            pairs: list[dict[str, tuple[float, float]]] = []  # each window next to the other engine's
            for i in range(2 * args.windows):
                name = order[i % 4]
                latencies, seconds = drive(engines[name], args.model, tensors, args.concurrency, args.seconds)
                results[name] += latencies
                spent[name] += seconds
                if i % 2 == 0:
                    pairs.append({})
                pairs[-1][name] = (len(latencies) / seconds, percentile_ms(latencies, 99))
            print(f"load average after: {os.getloadavg()}")
            print(f"{'engine':<9}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'mean batch':>12}")
            figures = {}
            for name, engine in engines.items():
                (loaded,) = engine.loaded(args.model)
                stats = loaded.batcher.stats
                batch = stats.inference_count / max(1, stats.execution_count)
                figures[name] = (len(results[name]) / spent[name], *(percentile_ms(results[name], q) for q in (50, 99)))
                rps, p50, p99 = figures[name]
                print(f"{name:<9}{rps:>8.1f}{p50:>9.1f}{p99:>9.1f}{batch:>12.1f}")
            (a_rps, a_p50, a_p99), (b_rps, b_p50, b_p99) = figures["max"], figures["limited"]
            print(f"limited / max: req/s x{b_rps / a_rps:.2f}  p50 x{b_p50 / a_p50:.2f}  p99 x{b_p99 / a_p99:.2f}")
            for i, what in ((0, "req/s"), (1, "p99")):
                ratios = sorted(p["limited"][i] / p["max"][i] for p in pairs)
                print(f"  per adjacent pair of windows, {what}: median x{statistics.median(ratios):.2f} "
                      f"(x{ratios[0]:.2f} to x{ratios[-1]:.2f}, {len(ratios)} pairs)")  # fmt: skip
        finally:
            for engine in engines.values():
                engine.drain(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
