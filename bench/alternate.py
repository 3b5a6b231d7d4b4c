"""Batching limits compared in one running server, switched every window: `python -m bench.alternate`.

Fresh starts of Flightdeck at the same settings differ by more than most settings do (textcls seq 128,
c=32: 281 to 319 req/s in a first window; docs/benchmarks.md), so comparing settings across starts
mostly measures the starts. This starts the server once, as `make run` does but with the batch limit
from the cost curve off (the max batch size is then the limit), and switches the engine-wide batching
limits through `PUT /api/engine/batching` before each window, in the order A B, B A, A B, ...; each
window starts once every serving process has applied the change. It prints every window, then per
setting its mean req/s and p99, and each setting's ratio to the first within each pair of windows.

    python -m bench.alternate [--workload textcls128] [--concurrency 32] [--max-batch-sizes 2,4]
                              [--pairs 6] [--seconds 5] [--settle 15] [--env FLIGHTDECK_X=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

from bench.loadgen import drive
from bench.measure import WORKLOADS, percentile_ms, request_body, sample_inputs
from bench.peers import flightdeck_running
from bench.rollout import call, operator_token


@dataclass(frozen=True)
class Window:
    """One window at one max batch size."""

    pair: int
    max_batch_size: int
    rps: float
    p99_ms: float
    errors: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.alternate", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="textcls128", choices=sorted(WORKLOADS))
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-batch-sizes", default="2,4", help="comma-separated; the first is the reference")
    p.add_argument("--pairs", type=int, default=6, help="rounds of one window per setting")
    p.add_argument("--seconds", type=float, default=5.0, help="window length")
    p.add_argument("--settle", type=float, default=15.0,
                   help="seconds of load before the first window (past start-up work: the job process's first start)")  # fmt: skip
    p.add_argument("--env", action="append", default=[], metavar="FLIGHTDECK_X=VALUE", help="a setting for the server")
    return p.parse_args(argv)


def applied(port: int, token: str, processes: int, timeout_s: float = 30.0) -> None:
    """Wait until `processes` serving processes report the engine-wide generation now desired."""
    deadline = time.monotonic() + timeout_s
    while True:
        desired = call(port, "GET", "/api/engine/desired", token)
        done = [p for p in desired["processes"] if p["generation"] >= desired["generation"]]
        if len(done) >= processes:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"generation {desired['generation']} not applied within {timeout_s} s: {desired}")
        time.sleep(0.1)  # NOTE: polling the processes' own report, the condition waited for


def run(args: argparse.Namespace) -> list[Window]:
    sizes = [int(s) for s in args.max_batch_sizes.split(",") if s]
    model, seq_len = WORKLOADS[args.workload]
    env = {"FLIGHTDECK_BATCH_LIMIT_FROM_COST": "false", **dict(item.split("=", 1) for item in args.env)}
    windows: list[Window] = []
    with flightdeck_running(env, "flightdeck-alternate-") as running:
        port, token = running.server.port, operator_token(running.home)
        spec = running.spec(model)
        body = request_body(sample_inputs(spec, 1, seq_len), spec)
        path = f"/v2/models/{model}/infer"
        if args.settle > 0:
            drive(port, path, body, args.concurrency, 1.0, args.settle, lambda: {})
        for pair in range(args.pairs):
            for size in sizes if pair % 2 == 0 else sizes[::-1]:  # NOTE: A B, B A: a drift weighs on both
                call(port, "PUT", "/api/engine/batching", token, {"max_batch_size": size})
                applied(port, token, running.workers)
                w = drive(port, path, body, args.concurrency, 1.0, args.seconds, lambda: {})
                ok = w.statuses.get(200, 0)
                windows.append(
                    Window(pair, size, ok / w.seconds, percentile_ms(w.latencies, 99), sum(w.statuses.values()) - ok)
                )
                last = windows[-1]
                print(f"pair {pair} max batch {size:>3}: {last.rps:7.0f} req/s  p99 {last.p99_ms:6.1f} ms"
                      f"  errors {last.errors}", flush=True)  # fmt: skip
    return windows


def summary(windows: list[Window]) -> list[str]:
    """Per setting: mean req/s and p99, and its ratio to the first setting within each pair."""
    sizes = list(dict.fromkeys(w.max_batch_size for w in windows))
    first = {w.pair: w.rps for w in windows if w.max_batch_size == sizes[0]}
    lines = []
    for size in sizes:
        mine = [w for w in windows if w.max_batch_size == size]
        ratios = [w.rps / first[w.pair] for w in mine if first.get(w.pair)]
        lines.append(
            f"max batch {size:>3}: {statistics.mean(w.rps for w in mine):7.0f} req/s, "
            f"p99 {statistics.mean(w.p99_ms for w in mine):6.1f} ms, errors {sum(w.errors for w in mine)}; "
            f"x{statistics.mean(ratios):.2f} of max batch {sizes[0]} "
            f"(pairs: {' '.join(f'{r:.2f}' for r in ratios)})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    windows = run(parse_args(argv))
    for line in summary(windows):
        print(line)
    return 0 if windows and not any(w.errors for w in windows) else 1


if __name__ == "__main__":
    sys.exit(main())
