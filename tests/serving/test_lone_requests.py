"""A request that runs with nothing else running or queued may use a session with every core (issue 26).

Batcher: such a run goes to `run_alone`, any other to the shared session. Engine: the second session is
made only on the CPU, with fewer intra-op threads per instance than cores, and kept only where the
timing at load says it is faster; it answers what the shared session answers.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from serving import engine as engine_module
from serving.batching import INLINE_AFTER, Batcher
from serving.cores import HOLDOFF_S, CoreClaim
from serving.engine import Engine
from serving.modelconfig import triton_config
from serving.settings import BatchingSettings, RuntimeSettings
from tests.fakes import VECTOR_SPEC, Echo, Gated, vector


def make(shared, alone, **kw) -> Batcher:
    options = {"max_batch_size": 8, "max_queue_delay_s": 0.05, "max_queue_size": 64, "instances": 2}
    return Batcher(shared, VECTOR_SPEC, run_alone=alone, **(options | kw))


def test_a_request_with_nothing_else_running_or_queued_runs_on_the_lone_session() -> None:
    shared, alone = Echo(), Echo()
    batcher = make(shared, alone)
    try:
        answer = batcher.result(batcher.submit(vector(3.0), 1, 0, 10))
        assert answer["y"].tolist() == [[6.0] * 4]
        assert len(alone.batches) == 1 and shared.batches == []
        assert (batcher.stats.lone_runs, batcher.stats.execution_count) == (1, 1)
    finally:
        batcher.close(5)


class SpyClaim(CoreClaim):
    """The real claim; `waiting` is set when a run asks for a shared claim (it may then wait on the lock)."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(path)
        self.waiting = threading.Event()

    @contextmanager
    def hold(self, every: bool) -> Iterator[bool]:
        if not every:
            self.waiting.set()
        with super().hold(every) as got:
            yield got


def test_a_request_beside_a_running_lone_one_waits_it_out_then_runs_on_the_shared_session() -> None:
    order: list[str] = []
    alone = Gated(inner=lambda t: order.append("alone ended") or {"y": t["x"] * 2})
    shared = lambda t: order.append("shared began") or {"y": t["x"] * 2}  # noqa: E731
    claim = SpyClaim()
    batcher = make(shared, alone, cores=claim)
    try:
        first = batcher.submit(vector(1.0), 1, 0, 10)
        assert alone.started.wait(5)  # the first found the batcher idle: it holds the lone session and every core
        second = batcher.submit(vector(2.0), 1, 0, 10)
        assert claim.waiting.wait(5)  # the other executor took it, for the shared session
        alone.gate.set()
        assert batcher.result(second)["y"].tolist() == [[4.0] * 4]
        assert batcher.result(first)["y"].tolist() == [[2.0] * 4]
        assert order == ["alone ended", "shared began"]  # no run on a share of the cores beside a lone one
        assert (batcher.stats.lone_runs, batcher.stats.execution_count) == (1, 2)
    finally:
        alone.gate.set()
        batcher.close(5)


def test_a_lone_request_runs_on_the_shared_session_while_another_process_runs(tmp_path: Path) -> None:
    # NOTE: flock locks belong to open file descriptions; another thread's claim on the same file stands in for
    # another worker's run (tests/serving/test_cores.py shows it across real processes).
    shared, alone = Echo(), Echo()
    now = [0.0]
    batcher = make(shared, alone, cores=CoreClaim(tmp_path / "cores.lock", lambda: now[0]))
    other = CoreClaim(tmp_path / "cores.lock")
    try:
        with other.hold(every=False):
            batcher.result(batcher.submit(vector(1.0), 1, 0, 10))
        assert len(shared.batches) == 1 and alone.batches == []
        now[0] += HOLDOFF_S
        batcher.result(batcher.submit(vector(2.0), 1, 0, 10))
        assert len(alone.batches) == 1  # the node idle again, and calm for HOLDOFF_S: every core
    finally:
        batcher.close(5)


def test_a_merged_batch_runs_on_the_shared_session_even_with_nothing_else_running() -> None:
    alone, shared = Gated(), Echo()
    batcher = make(shared, alone, instances=1)
    try:
        first = batcher.submit(vector(1.0), 1, 0, 10)
        assert alone.started.wait(5)
        queued = [batcher.submit(vector(float(n)), 1, 0, 10) for n in (2, 3)]  # they wait behind it, then merge
        alone.gate.set()
        assert [batcher.result(p)["y"].tolist() for p in queued] == [[[4.0] * 4], [[6.0] * 4]]
        batcher.result(first)
        assert alone.calls == 1 and [len(b["x"]) for b in shared.batches] == [2]  # merging means load
    finally:
        alone.gate.set()
        batcher.close(5)


def test_a_version_without_a_lone_session_still_keeps_another_workers_lone_run_off_the_cores(tmp_path: Path) -> None:
    # NOTE: the other worker's version kept its lone session, this one did not (or it is another model): its runs
    # must still be seen, or a lone run would spin every core beside them.
    shared = Gated()
    batcher = Batcher(shared, VECTOR_SPEC, max_batch_size=8, max_queue_delay_s=0.05, max_queue_size=64,
                      cores=CoreClaim(tmp_path / "cores.lock"))  # fmt: skip
    other_worker = CoreClaim(tmp_path / "cores.lock")
    try:
        pending = batcher.submit(vector(1.0), 1, 0, 10)
        assert shared.started.wait(5)
        with other_worker.hold(every=True) as every:
            assert not every
        shared.gate.set()
        assert batcher.result(pending)["y"].tolist() == [[2.0] * 4]
    finally:
        shared.gate.set()
        batcher.close(5)


def test_a_callers_inline_run_uses_the_lone_session() -> None:
    shared, alone = Echo(), Echo()
    batcher = make(shared, alone)
    try:
        for n in range(INLINE_AFTER + 2):  # past INLINE_AFTER idle arrivals the caller runs its own request
            pending = batcher.submit(vector(float(n)), 1, 0, 10, caller_runs=True)
            batcher.result(pending)
        assert pending.inline
        assert len(alone.batches) == INLINE_AFTER + 2 and shared.batches == []
    finally:
        batcher.close(5)


def test_without_a_lone_session_every_batch_runs_on_the_shared_one() -> None:
    shared = Echo()
    batcher = make(shared, None)
    try:
        batcher.result(batcher.submit(vector(1.0), 1, 0, 10))
        assert len(shared.batches) == 1
    finally:
        batcher.close(5)


@pytest.fixture
def textcls(demo_store: Path) -> Path:
    return demo_store / "textcls" / "1"


def _engine(monkeypatch: pytest.MonkeyPatch, cores: int, claim: CoreClaim | None = None, **runtime) -> Engine:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    runtime = {"lone_request_session": True} | runtime
    return Engine(RuntimeSettings(device="cpu", **runtime), BatchingSettings(warmup_max_sequence=32), cores=claim)


def test_the_lone_session_is_kept_where_timing_says_it_is_faster_and_answers_the_same(
    monkeypatch: pytest.MonkeyPatch, textcls: Path, tmp_path: Path
) -> None:
    # NOTE: the timing is the machine's; here it is given, so the test is about what the engine does with it.
    monkeypatch.setattr(engine_module, "lone_request_times", lambda shared, alone, sample, budget: (2.0, 1.0))
    ran_on: list[int] = []  # the intra-op threads of the session of each run
    load = engine_module.load_session

    def counted(path: Path, runtime: RuntimeSettings):
        session = load(path, runtime)
        run = session.run
        session.run = lambda inputs: ran_on.append(runtime.intra_op_threads) or run(inputs)
        return session

    monkeypatch.setattr(engine_module, "load_session", counted)
    engine = _engine(monkeypatch, cores=2, claim=CoreClaim(tmp_path / "cores.lock"))
    loaded = engine.load(textcls)
    try:
        assert loaded.alone is not None
        assert loaded.session.session.get_session_options().intra_op_num_threads == 1
        lone = loaded.alone.session.get_session_options()
        assert lone.intra_op_num_threads == 2
        # spinning within a run only: two threads without it were no faster than one (serving.engine)
        assert lone.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert lone.get_session_config_entry("session.force_spinning_stop") == "1"
        shown = triton_config(loaded.spec, loaded.config, on_gpu=False)["parameters"]  # /v2/models/{m}/config
        assert shown["lone_request_threads"]["string_value"] == "2"
        assert json.loads(shown["lone_request_ms"]["string_value"]) == {"shared": 2000.0, "alone": 1000.0}
        ids = np.array([[5, 9, 14, 3, 8, 1, 1, 2]], dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        expected = loaded.session.run(inputs)
        del ran_on[:]
        answer = engine.infer("textcls", inputs).outputs
        assert ran_on == [2]  # an idle engine's request: on the session with both cores
        for name, value in expected.items():
            np.testing.assert_allclose(answer[name], value, rtol=1e-5, atol=1e-6)
        with CoreClaim(tmp_path / "cores.lock").hold(every=False):  # another worker of the node is running
            engine.infer("textcls", inputs)
        assert ran_on == [2, 1]
    finally:
        engine.drain(5)


@pytest.mark.parametrize(
    ("cores", "runtime", "times", "why"),
    [
        (2, {}, (1.0, 0.95), "not faster by LONE_MIN_GAIN"),
        (2, {"lone_request_session": False}, (2.0, 1.0), "turned off"),
        (1, {}, (2.0, 1.0), "one core: the shared session has them all"),
        (2, {"intra_op_threads": 2}, (2.0, 1.0), "the shared session already has every core"),
        (2, {"available": 4096}, (2.0, 1.0), "a second copy of the weights would not fit"),
    ],
)
def test_no_lone_session_where_it_would_not_pay(
    monkeypatch: pytest.MonkeyPatch, textcls: Path, cores: int, runtime: dict, times: tuple, why: str
) -> None:
    monkeypatch.setattr(engine_module, "lone_request_times", lambda shared, alone, sample, budget: times)
    available = runtime.pop("available", None)
    if available is not None:  # bytes the kernel says are free: far less than ten copies of textcls
        monkeypatch.setattr(engine_module, "available_bytes", lambda: available)
    engine = _engine(monkeypatch, cores=cores, **runtime)
    try:
        loaded = engine.load(textcls)
        assert loaded.alone is None, why
        shown = triton_config(loaded.spec, loaded.config, on_gpu=False).get("parameters", {})
        timed = why.startswith("not faster")  # the others never made a second session to time
        assert shown.get("lone_request_threads", {}).get("string_value") == ("0" if timed else None)
    finally:
        engine.drain(5)


def test_the_timing_compares_the_two_sessions_on_the_same_sample() -> None:
    from serving.batchcost import lone_request_times

    seen: list[tuple[str, float]] = []
    sample = vector(1.0)
    shared_s, alone_s = lone_request_times(
        lambda t: seen.append(("shared", float(t["x"][0, 0]))), lambda t: seen.append(("alone", 1.0)), sample, 0.0
    )
    assert 0 < shared_s and 0 < alone_s
    assert seen[0] == ("alone", 1.0)  # warmed once first
    assert [who for who, _ in seen[1:5]] == ["shared", "alone", "shared", "alone"]  # interleaved


def disturbances(monkeypatch: pytest.MonkeyPatch, cores: list[float | None]) -> list[float | None]:
    """Have each lone timing's measure of other processes (serving.nodeload, tested there) report the next of `cores`."""
    seen: list[float | None] = []

    class Given:
        cores: float | None = None

        def __enter__(self) -> Given:
            return self

        def __exit__(self, *_: object) -> None:
            self.cores = cores[len(seen)]
            seen.append(self.cores)

    monkeypatch.setattr(engine_module, "OthersBusy", Given)
    monkeypatch.setattr(engine_module, "LONE_RETRY_S", 0.0)
    return seen


def test_a_timing_while_other_processes_kept_the_cores_busy_is_taken_again(
    monkeypatch: pytest.MonkeyPatch, textcls: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # NOTE: a busy node makes every core look no faster (the first timing); a quiet one, twice as fast.
    seen = disturbances(monkeypatch, [0.9, 0.0])
    monkeypatch.setattr(engine_module, "lone_request_times", lambda *_: (2.0, 1.0) if seen else (1.0, 0.95))
    engine = _engine(monkeypatch, cores=2)
    with caplog.at_level("INFO", logger="serving.engine"):
        loaded = engine.load(textcls)
    try:
        assert seen == [0.9, 0.0]
        assert loaded.alone is not None  # the quiet timing decided
        assert "lone-request timing 1 of 3 disturbed: other processes kept 0.90 cores busy" in caplog.text
        shown = triton_config(loaded.spec, loaded.config, on_gpu=False)["parameters"]
        assert json.loads(shown["lone_request_ms"]["string_value"]) == {
            "shared": 2000.0,
            "alone": 1000.0,
            "others_cores": 0.0,
        }
    finally:
        engine.drain(5)


@pytest.mark.parametrize(
    ("cores", "timings"),
    [([0.9, 0.8, 0.7], 3), ([None], 1)],
    ids=["busy throughout: the last timing decides", "unknown (no /proc/stat): the one timing decides"],
)
def test_a_node_busy_throughout_or_unmeasured_decides_on_the_timing_it_has(
    monkeypatch: pytest.MonkeyPatch, textcls: Path, cores: list[float | None], timings: int
) -> None:
    seen = disturbances(monkeypatch, cores)
    monkeypatch.setattr(engine_module, "lone_request_times", lambda *_: (1.0, 0.95))
    engine = _engine(monkeypatch, cores=2)
    loaded = engine.load(textcls)
    try:
        assert len(seen) == timings
        assert loaded.alone is None  # not faster: a node busy throughout has no core to spare for a lone request
        shown = json.loads(
            triton_config(loaded.spec, loaded.config, on_gpu=False)["parameters"]["lone_request_ms"]["string_value"]
        )
        assert shown.get("others_cores") == cores[-1]
    finally:
        engine.drain(5)
