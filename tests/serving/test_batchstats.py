"""Batcher statistics read while executor threads write them: every read is one consistent moment."""

from __future__ import annotations

import threading

import numpy as np

from serving.batching import Batcher
from serving.batchstats import BatcherStats
from tests.fakes import VECTOR_SPEC, vector

CLIENTS = 6
REQUESTS_PER_CLIENT = 500


class Doubler:
    """Double the input; a request whose first value is negative fails, as a broken kernel would."""

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (inputs["x"][:, 0] < 0).any():
            raise RuntimeError("kernel exploded")
        return {"y": inputs["x"] * 2}


def broken_invariants(s: BatcherStats) -> list[str]:
    """Say which relations between counters that one batch updates together do not hold."""
    broken = []
    if s.success + s.failed != s.latency.total:
        broken.append(f"success {s.success} + failed {s.failed} != latency count {s.latency.total}")
    if sum(count for count, _ in s.batch_sizes.values()) != s.execution_count:
        broken.append(f"executions by batch size != execution_count {s.execution_count}")
    if sum(ns for _, ns in s.batch_sizes.values()) != s.compute_ns:
        broken.append(f"compute ns by batch size != compute_ns {s.compute_ns}")
    return broken


def test_stats_read_during_traffic_are_always_consistent() -> None:
    batcher = Batcher(Doubler(), VECTOR_SPEC, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=1024, instances=3)
    done = threading.Event()
    reads: list[int] = [0]
    violations: list[str] = []
    unexpected: list[str] = []  # a thread's own assert would not fail the test

    def client(seed: int) -> None:
        for i in range(REQUESTS_PER_CLIENT):
            bad = (i + seed) % 17 == 0  # some batches fail and are bisected: failed and bisect runs move too
            pending = batcher.submit(vector(-1.0 if bad else 1.0, batch=1 + i % 3), 1 + i % 3, 0, 30.0)
            try:
                batcher.result(pending)
            except Exception as exc:
                if not bad:
                    unexpected.append(repr(exc))

    def reader() -> None:
        while not done.is_set():
            broken = broken_invariants(batcher.stats)
            reads[0] += 1
            if broken:
                violations.extend(broken)
                return

    clients = [threading.Thread(target=client, args=(seed,)) for seed in range(CLIENTS)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for thread in clients:
        thread.start()
    try:
        for thread in clients:
            thread.join()
    finally:
        done.set()
        watcher.join()
        batcher.close(10)
    assert violations == [] and unexpected == []
    assert reads[0] > 100  # the reader really overlapped the writers
    final = batcher.stats
    assert final.success + final.failed == CLIENTS * REQUESTS_PER_CLIENT and broken_invariants(final) == []


def test_stats_are_a_copy_the_batcher_no_longer_writes() -> None:
    batcher = Batcher(Doubler(), VECTOR_SPEC, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=64)
    try:
        before = batcher.stats
        batcher.result(batcher.submit(vector(1.0), 1, 0, 30.0))
        after = batcher.stats
    finally:
        batcher.close(10)
    assert (before.success, before.latency.total, before.batch_sizes) == (0, 0, {})
    assert (after.success, after.latency.total, set(after.batch_sizes)) == (1, 1, {1})


def test_codec_times_are_counted_per_request() -> None:
    batcher = Batcher(Doubler(), VECTOR_SPEC, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=64)
    try:
        batcher.record_codec(2000, 3000)
        batcher.record_codec(4000, 1000)
    finally:
        batcher.close(10)
    s = batcher.stats
    assert (s.decoded, s.decode_ns, s.encoded, s.encode_ns) == (2, 6000, 2, 4000)
