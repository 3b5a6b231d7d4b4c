"""Memory fragmentation over the real engine: a mixed-length workload raises it, compaction brings it down."""

from __future__ import annotations

import gc
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from serving.engine import Engine
from serving.memory import ArenaLedger, HeapStats, arena_idle_bytes, heap_stats, shape_key, trim_heap
from serving.runtime import load_session
from serving.settings import BatchingSettings, RuntimeSettings

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(heap_stats() is None, reason="needs glibc's mallinfo2 (glibc 2.33 or later)")

# Short and long requests, some carrying several rows, so batches of many shapes form whatever the timing.
LENGTHS = (8, 512, 24, 300, 16, 128, 40, 200, 512, 64)
ROWS = (1, 4, 1, 2, 1, 1, 2, 1, 2, 1)


def textcls_request(i: int) -> dict[str, np.ndarray]:
    length, rows = LENGTHS[i % len(LENGTHS)], ROWS[i % len(ROWS)]
    ids = np.random.default_rng(i).integers(1, 30000, size=(rows, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def mixed_workload(engine: Engine, requests: int = 200) -> None:
    """Send mixed-length requests from 12 client threads; keep no outputs (they would pin arena memory)."""

    def one(i: int) -> int:
        return engine.infer("textcls", textcls_request(i)).batch_size

    with ThreadPoolExecutor(12) as clients:
        sizes = list(clients.map(one, range(requests)))
    assert len(sizes) == requests


def reading() -> HeapStats:
    gc.collect()
    stats = heap_stats()
    assert stats is not None
    return stats


@pytest.fixture
def engine(demo_store: Path):
    eng = Engine(
        RuntimeSettings(device="cpu", intra_op_threads=1),
        BatchingSettings(max_batch_size=8, max_queue_delay_ms=2.0, warmup_max_sequence=128),
    )
    eng.load(demo_store / "textcls" / "1")
    yield eng
    eng.drain(30)


def test_the_figures_hang_together() -> None:
    stats = reading()
    assert stats.in_use_bytes == stats.heap_live_bytes - stats.arena_idle_bytes
    assert 0 < stats.reserved_bytes <= stats.rss_bytes
    assert 0.0 <= stats.fragmentation <= 1.0
    assert stats.as_dict()["fragmentation"] == round(stats.fragmentation, 4)
    assert HeapStats(rss_bytes=0, reserved_bytes=0, in_use_bytes=0).fragmentation == 0.0


def test_mixed_lengths_raise_fragmentation_and_compaction_brings_it_down(demo_store: Path) -> None:
    # NOTE: heap figures are process-wide, and memory earlier tests freed (glibc keeps some of it whatever
    # malloc_trim does) skewed the baseline by test order; a fresh interpreter measures this engine alone.
    code = f"from tests.serving.test_memory import fragmentation_cycle; fragmentation_cycle({str(demo_store)!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


def fragmentation_cycle(store: str) -> None:
    """Raise fragmentation with a mixed workload, then compact it away; assert each step (run in a fresh process)."""
    engine = Engine(
        RuntimeSettings(device="cpu", intra_op_threads=1),
        BatchingSettings(max_batch_size=8, max_queue_delay_ms=2.0, warmup_max_sequence=128),
    )
    engine.load(Path(store) / "textcls" / "1")
    try:
        _fragmentation_cycle(engine)
    finally:
        engine.drain(30)


def _fragmentation_cycle(engine: Engine) -> None:
    ledger = engine.loaded("textcls")[0].session.ledger
    trim_heap()
    warm = reading()
    warm_idle = ledger.idle_bytes

    mixed_workload(engine)
    loaded = reading()
    # Long batches grew ONNX Runtime's arena; between runs all of that growth is idle.
    assert ledger.idle_bytes > warm_idle + 40 * MiB
    assert loaded.fragmentation > warm.fragmentation + 0.10

    # Control: glibc's trim alone, without the arena shrink, leaves the figure up; the idle memory is the arena's.
    tracked = ledger.idle_bytes
    trim_heap()
    trimmed = reading()
    assert ledger.idle_bytes == tracked
    assert trimmed.fragmentation > loaded.fragmentation - 0.05

    report = engine.compact_memory()
    compacted = reading()
    (shrunk,) = report["sessions"]
    assert shrunk["model"] == "textcls" and shrunk["shrunk"] == ["cpu:0"] and not shrunk["errors"]
    # The arena gave back about what was counted as idle: the estimate stands for real bytes.
    released = -shrunk["heap_live_change_bytes"]
    assert released > 40 * MiB
    assert 0.5 * tracked < released < 1.5 * tracked
    assert ledger.idle_bytes == 0
    assert report["before"]["heap"]["fragmentation"] > report["after"]["heap"]["fragmentation"] + 0.10
    assert compacted.rss_bytes < trimmed.rss_bytes - 40 * MiB
    assert compacted.reserved_bytes < trimmed.reserved_bytes - 40 * MiB
    assert compacted.fragmentation < trimmed.fragmentation - 0.10
    # Live data is what it was: compaction frees idle memory, not memory in use.
    assert abs(compacted.in_use_bytes - loaded.in_use_bytes) < 24 * MiB

    # The engine still serves, and a second round rises and falls again.
    mixed_workload(engine, 100)
    again = reading()
    assert again.fragmentation > compacted.fragmentation + 0.10
    engine.compact_memory()
    assert reading().fragmentation < again.fragmentation - 0.10


def test_compaction_while_requests_are_in_flight_loses_none(engine: Engine) -> None:
    with ThreadPoolExecutor(1) as side:
        reports = side.submit(lambda: [engine.compact_memory() for _ in range(5)])
        mixed_workload(engine, 60)
        for report in reports.result():
            assert report["sessions"][0]["shrunk"] == ["cpu:0"]


def test_a_session_without_a_cpu_arena_has_nothing_to_shrink(demo_store: Path) -> None:
    session = load_session(
        demo_store / "mlp" / "1" / "model.onnx", RuntimeSettings(device="cpu", enable_cpu_mem_arena=False)
    )
    sample = {"input": np.zeros((1, 64), np.float32)}
    report = session.shrink_arena(sample)
    assert report["devices"] == [] and report["shrunk"] == [] and not report["errors"]
    assert session.run(sample)["probabilities"].shape == (1, 10)


def test_a_run_is_watched_while_it_can_grow_the_arena() -> None:
    ledger = ArenaLedger()
    big = shape_key({"input_ids": np.zeros((4, 512)), "attention_mask": np.zeros((4, 512))})
    kept = [ledger.run(big, lambda: bytearray(16 * MiB))]
    assert ledger.watched_runs == 1 and not ledger.settled(big)
    assert ledger.idle_bytes >= 12 * MiB
    ledger.run(big, lambda: None)
    ledger.run(big, lambda: None)
    assert ledger.settled(big) and ledger.watched_runs == 2
    # A run overlapping another run of the same session is watched, settled shapes or not.
    assert ledger.run(big, lambda: ledger.run(big, lambda: "inner")) == "inner"
    assert ledger.watched_runs == 3
    smaller = shape_key({"input_ids": np.zeros((2, 300)), "attention_mask": np.zeros((2, 300))})
    assert not ledger.settled(smaller)
    counted = arena_idle_bytes()
    _, change = ledger.shrink(kept.clear)
    assert change <= -12 * MiB
    assert ledger.idle_bytes == 0 and not ledger.settled(big)
    assert arena_idle_bytes() <= counted - 12 * MiB
