"""Batch sizes bounded by a model's own cost curve, measured at warm-up.

A merged batch is worth growing only while the cost per sample keeps falling. On a GPU it falls
to large batches; on a CPU it often flattens early (the demo text classifier at 128 tokens gains
nothing past batch 8), and a batch past that point only lengthens the wait of every request in it
and of every request queued behind it: tail latency bought for no throughput.

So at load the engine times one run at batch 1, 2, 4, ... up to the configured max (per sequence
bucket, longest first, within a time budget) and keeps, per bucket, the smallest batch size whose
cost per sample is within `margin` of the best it measured, and never 1 (see `choose_limit`). The
batcher merges requests up to that size; a single request larger than it (up to the configured max)
still runs, alone. A curve still falling by more than the margin at the last size measured (the max,
or where the budget ran out) bounds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# At least this many timed runs per size, and more (up to MAX_REPEATS) until they add up to MIN_TIMED_S:
# the least of them is the figure, so a run slowed by another process on the cores does not count.
# (Two suffice for a long run timed by thread CPU time: preemption does not count there.)
MIN_REPEATS = 2
MAX_REPEATS = 15
MIN_TIMED_S = 0.02
# Measuring a bucket stops after this many sizes in a row that did not beat the best by the margin.
PATIENCE = 2
# Then every size measured runs once more per round, this many rounds, largest first.
ROUNDS = 4


@dataclass(frozen=True)
class CostCurve:
    """What warm-up measured: seconds per run at each batch size, per sequence bucket (0: no sequence axis)."""

    points: dict[int, tuple[tuple[int, float], ...]]
    # Per measured bucket, the batch size past which cost per sample stopped falling; None: it never stopped.
    limits: dict[int, int | None]
    margin: float
    seconds: float  # time spent measuring

    def limits_under(self, max_batch_size: int) -> dict[int, int]:
        """Return each measured bucket's batch limit under `max_batch_size` (a bucket without a bound gets it)."""
        return {bucket: min(limit or max_batch_size, max_batch_size) for bucket, limit in self.limits.items()}

    def to_json(self) -> dict[str, Any]:
        """Return the curve as JSON values (serving.measured shares it between the workers of a node)."""
        return {
            "points": {str(bucket): [list(point) for point in points] for bucket, points in self.points.items()},
            "limits": {str(bucket): limit for bucket, limit in self.limits.items()},
            "margin": self.margin,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> CostCurve:
        """Return the curve `to_json` wrote (KeyError, TypeError, ValueError or AttributeError where it is not one)."""
        return cls(
            points={int(b): tuple((int(n), float(s)) for n, s in points) for b, points in value["points"].items()},
            limits={int(b): None if limit is None else int(limit) for b, limit in value["limits"].items()},
            margin=float(value["margin"]),
            seconds=float(value["seconds"]),
        )

    def describe(self) -> dict[str, dict[str, float]]:
        """Return milliseconds per sample at each batch size, per bucket, for people and /v2/models/{m}/config."""
        return {
            str(bucket): {str(batch): round(1000 * seconds / batch, 4) for batch, seconds in points}
            for bucket, points in sorted(self.points.items())
        }


def limit_for(limits: Mapping[int, int], bucket: int) -> int | None:
    """Return the batch limit of a bucket: the nearest measured bucket at or above it, else the longest (None: none).

    A longer sequence costs more per sample, so an unmeasured long bucket takes the longest measured one's
    limit, and a short one the limit of the next measured bucket up (never larger than its own would be).
    """
    if not limits:
        return None
    above = [b for b in limits if b >= bucket]
    return limits[min(above)] if above else limits[max(limits)]


def choose_limit(points: list[tuple[int, float]], margin: float) -> int | None:
    """Return the smallest batch size whose cost per sample is within `margin` of the best measured, and at least 2.

    `points` are (batch size, seconds per run), smallest batch first. None (no bound) when nothing was
    measured, or when the chosen size is the last one measured: the curve was still falling there, so
    a larger batch (a larger max batch size, or a size the budget left unmeasured) may pay too.

    Never 1 where 2 was measured: a run costs the server more than the model's own time (an executor woken,
    the claim on the cores, each answer handed to its event loop), and merging two requests shares that,
    which a curve timed on the session alone cannot see. One server, limits alternated every 5 s at
    concurrency 32: the demo text classifier served 1.22-1.45x as much at 2 as at 1 at 32 tokens, and
    0.91-1.13x (mean 1.03) at 128, where a start's noisy curve had chosen 1.
    """
    if not points:
        return None
    per_sample = [(batch, seconds / batch) for batch, seconds in points]
    best = min(cost for _, cost in per_sample)
    chosen = next(batch for batch, cost in per_sample if cost <= best * (1 + margin))
    if chosen == 1 and len(per_sample) > 1:
        chosen = per_sample[1][0]
    return None if chosen == per_sample[-1][0] else chosen


def batch_sizes(max_batch_size: int) -> list[int]:
    """Return the sizes to time: powers of two below `max_batch_size`, then `max_batch_size` itself."""
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch_size]


def tile(sample: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """Return a batch of `batch` copies of a sample's first row (along axis 0)."""
    return {name: np.repeat(array[:1], batch, axis=0) for name, array in sample.items()}


def time_run(
    run: Callable[[dict[str, np.ndarray]], object],
    inputs: dict[str, np.ndarray],
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Return the least seconds of several runs of `inputs` by `clock`, after one untimed run (a new shape's allocations)."""
    run(inputs)
    times: list[float] = []
    while len(times) < MAX_REPEATS and (len(times) < MIN_REPEATS or sum(times) < MIN_TIMED_S):
        started = clock()
        run(inputs)
        times.append(clock() - started)
    return min(times)


def measure(
    run: Callable[[dict[str, np.ndarray]], object],
    samples: Mapping[int, dict[str, np.ndarray]],
    max_batch_size: int,
    margin: float,
    budget_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> CostCurve:
    """Time `run` on each bucket's sample tiled to every batch size of `batch_sizes`, longest bucket first.

    `samples` maps a sequence bucket (0: none) to one input of that bucket. A bucket stops early after
    PATIENCE sizes in a row that did not beat its best cost per sample by `margin`, then is timed again in
    ROUNDS rounds of one run per size (each size keeps its least); everything stops
    once `budget_s` of wall time is spent (what was measured still counts; buckets not reached bound
    nothing). `clock` times each run: the calling thread's CPU time (`time.thread_time`) where the run
    is all in this thread (ONNX Runtime on the CPU with one intra-op thread), so that other processes
    and threads on the cores do not count; wall time otherwise.
    """
    started = time.perf_counter()
    points: dict[int, tuple[tuple[int, float], ...]] = {}
    limits: dict[int, int | None] = {}
    for bucket in sorted(samples, reverse=True):
        if time.perf_counter() - started >= budget_s:
            break
        measured: list[tuple[int, float]] = []
        best, misses = float("inf"), 0
        sizes = batch_sizes(max_batch_size)
        for batch in sizes:
            seconds = time_run(run, tile(samples[bucket], batch), clock)
            measured.append((batch, seconds))
            if seconds / batch < best * (1 - margin):
                misses = 0
            else:
                misses += 1
            best = min(best, seconds / batch)
            if misses >= PATIENCE or time.perf_counter() - started >= budget_s:
                break
        # NOTE: a bound needs evidence that larger batches stop paying: the max reached, or PATIENCE sizes in
        # a row that did not pay. A bucket cut short by the budget while still paying bounds nothing.
        settled = misses >= PATIENCE or measured[-1][0] == sizes[-1]
        if settled:
            # NOTE: then rounds over every size measured, one run of each per round, each size keeping its
            # least: load on the cores comes in spells longer than one run, and a spell that fell on the
            # small sizes of the first pass (or spared the large ones) would bend the curve.
            inputs = [tile(samples[bucket], batch) for batch, _ in measured]
            for _ in range(ROUNDS):
                if time.perf_counter() - started >= budget_s:
                    break
                for index in reversed(range(len(measured))):
                    batch, seconds = measured[index]
                    begun = clock()
                    run(inputs[index])
                    measured[index] = (batch, min(seconds, clock() - begun))
        points[bucket] = tuple(measured)
        limits[bucket] = choose_limit(measured, margin) if settled else None
    return CostCurve(points, limits, margin, time.perf_counter() - started)


def lone_request_times(
    shared: Callable[[dict[str, np.ndarray]], object],
    alone: Callable[[dict[str, np.ndarray]], object],
    sample: dict[str, np.ndarray],
    budget_s: float,
) -> tuple[float, float]:
    """Return the least wall time of `sample` on each of two sessions, runs interleaved, within `budget_s`.

    Wall time, not thread CPU time: the session with every core spends more CPU to answer sooner.
    Interleaved, so a slower moment of the machine falls on both; the least, so a preempted run does not count.
    """
    times: tuple[list[float], list[float]] = ([], [])
    alone(sample)  # NOTE: its first run allocates its arena and thread pool
    started = time.perf_counter()
    while len(times[0]) < MAX_REPEATS and (len(times[0]) < MIN_REPEATS or time.perf_counter() - started < budget_s):
        for run, seen in ((shared, times[0]), (alone, times[1])):
            t0 = time.perf_counter()
            run(sample)
            seen.append(time.perf_counter() - t0)
    return min(times[0]), min(times[1])
