"""The dynamic batcher with fake models: dispatch rules, buckets and padding, admission, deadlines, drain."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from serving.batching import Batcher, RequestOutcome
from serving.errors import DeadlineExceeded, InferenceFailed, InvalidInput, Overloaded, Unavailable
from serving.tensors import ModelSpec, TensorSpec
from tests.fakes import SEQUENCE_SPEC, VECTOR_SPEC, Echo, Failing, Gated, SequenceSum, sequence, vector


def make(run, spec=VECTOR_SPEC, **kw) -> Batcher:
    options = {"max_batch_size": 8, "max_queue_delay_s": 0.05, "max_queue_size": 64}
    options.update(kw)
    return Batcher(run, spec, **options)


def submit(batcher: Batcher, tensors: dict, timeout_s: float = 30.0, seq_len: int = 0):
    batch = next(iter(tensors.values())).shape[0]
    return batcher.submit(tensors, batch, seq_len, timeout_s)


def busy_with_one(batcher: Batcher, model: Gated):
    """Occupy the executor with one request blocked inside the model."""
    first = submit(batcher, vector(0.0))
    assert model.started.wait(5)
    return first


class Recorder:
    def __init__(self) -> None:
        self.outcomes: list[RequestOutcome] = []
        self.batches: list[tuple[int, int, int]] = []
        self.depths: list[int] = []

    def request_done(self, outcome, queue_s, compute_s, total_s) -> None:
        self.outcomes.append(outcome)

    def batch_done(self, size, real_tokens, padded_tokens, compute_s) -> None:
        self.batches.append((size, real_tokens, padded_tokens))

    def queue_changed(self, depth) -> None:
        self.depths.append(depth)


def test_idle_engine_dispatches_at_once_without_paying_the_window() -> None:
    echo = Echo()
    batcher = make(echo, max_queue_delay_s=30.0)
    pending = submit(batcher, vector(1.5))
    # With a 30 s window, only the idle rule can answer within 5 s.
    result = pending.future.result(timeout=5)
    np.testing.assert_array_equal(result["y"], np.full((1, 4), 3.0, dtype=np.float32))
    assert pending.queue_s < 1.0
    assert [b["x"].shape[0] for b in echo.batches] == [1]
    batcher.close()


def test_busy_engine_dispatches_a_full_batch_at_once() -> None:
    model = Gated()
    batcher = make(model, max_queue_delay_s=30.0)
    first = busy_with_one(batcher, model)
    queued = [submit(batcher, vector(float(i))) for i in range(1, 9)]
    model.gate.set()
    for i, pending in enumerate(queued, start=1):
        np.testing.assert_array_equal(batcher.result(pending)["y"], np.full((1, 4), 2.0 * i, dtype=np.float32))
        assert pending.batch_size == 8
    batcher.result(first)
    assert [b["x"].shape[0] for b in model.inner.batches] == [1, 8]
    batcher.close()


def test_partial_batch_waits_for_the_queue_delay_then_goes_together() -> None:
    model = Gated()
    delay = 0.2
    batcher = make(model, max_queue_delay_s=delay)
    busy_with_one(batcher, model)
    queued = [submit(batcher, vector(float(i))) for i in range(3)]
    model.gate.set()
    for pending in queued:
        batcher.result(pending)
        assert pending.batch_size == 3
        assert pending.queue_s >= delay * 0.99
    assert [b["x"].shape[0] for b in model.inner.batches] == [1, 3]
    batcher.close()


def test_requests_carrying_their_own_batch_count_as_samples() -> None:
    model = Gated()
    batcher = make(model)
    busy_with_one(batcher, model)
    a = submit(batcher, vector(1.0, batch=5))
    b = submit(batcher, vector(2.0, batch=3))
    model.gate.set()
    assert batcher.result(a)["y"].shape == (5, 4)
    np.testing.assert_array_equal(batcher.result(b)["y"], np.full((3, 4), 4.0, dtype=np.float32))
    assert [x["x"].shape[0] for x in model.inner.batches] == [1, 8]
    batcher.close()


def test_sequences_are_grouped_by_bucket_and_padded_with_their_mask() -> None:
    model = Gated(SequenceSum())
    recorder = Recorder()
    batcher = make(model, spec=SEQUENCE_SPEC, observer=recorder)
    first = batcher.submit(sequence([9]), 1, 1, 30.0)
    assert model.started.wait(5)
    lengths = {"a": [1, 2, 3], "b": [4, 5, 6, 7, 8, 9, 10], "c": [7, 7], "d": list(range(1, 13))}
    pending = {k: batcher.submit(sequence(ids), 1, len(ids), 30.0) for k, ids in lengths.items()}
    model.gate.set()
    for key, ids in lengths.items():
        result = batcher.result(pending[key])
        assert result["total"].tolist() == [[sum(ids)]]  # padding contributed nothing
        assert result["tokens"].tolist() == [ids]  # the sequence axis is cut back to the request's length
    batcher.result(first)
    shapes = [b["ids"].shape for b in model.inner.batches]
    # buckets (4, 8, 16): {a: 3, c: 2} share bucket 4 and pad to 3; b (7) is bucket 8; d (12) bucket 16
    assert shapes == [(1, 1), (2, 3), (1, 7), (1, 12)]
    padded_batch = model.inner.batches[1]
    assert padded_batch["mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert padded_batch["ids"].tolist() == [[1, 2, 3], [7, 7, 0]]
    assert (2, 5, 6) in recorder.batches  # 5 real positions, 6 run: one padded
    assert batcher.stats.padded_tokens - batcher.stats.real_tokens == 1
    batcher.close()


def test_full_queue_refuses_at_once_with_retry_after() -> None:
    model = Gated()
    recorder = Recorder()
    batcher = make(model, max_queue_size=4, observer=recorder)
    busy_with_one(batcher, model)
    accepted = [submit(batcher, vector(1.0)) for _ in range(3)]
    with pytest.raises(Overloaded) as refused_big:
        submit(batcher, vector(1.0, batch=2))  # 3 + 2 > 4
    accepted.append(submit(batcher, vector(1.0)))
    with pytest.raises(Overloaded) as refused:
        submit(batcher, vector(1.0))
    assert refused.value.status == 429 and refused.value.retry_after >= 1
    assert "full" in refused.value.message and "full" in refused_big.value.message
    assert batcher.stats.rejected == 2
    model.gate.set()
    for pending in accepted:  # nothing accepted is dropped
        assert batcher.result(pending)["y"].shape == (1, 4)
    assert recorder.outcomes.count(RequestOutcome.REJECTED) == 2
    batcher.close()


def test_request_whose_deadline_passes_in_the_queue_times_out_and_never_runs() -> None:
    model = Gated()
    recorder = Recorder()
    batcher = make(model, observer=recorder)
    first = busy_with_one(batcher, model)
    doomed = submit(batcher, vector(42.0), timeout_s=0.05)
    with pytest.raises(DeadlineExceeded, match="not run"):
        batcher.result(doomed)
    survivor = submit(batcher, vector(7.0))
    model.gate.set()
    batcher.result(first)
    batcher.result(survivor)
    ran = np.concatenate([b["x"] for b in model.inner.batches])
    assert 42.0 not in ran
    assert batcher.stats.timeouts == 1
    assert RequestOutcome.TIMEOUT in recorder.outcomes
    batcher.close()


def test_executor_expires_overdue_requests_while_waiting_for_a_batch() -> None:
    model = Gated()
    batcher = make(model, max_queue_delay_s=30.0)
    busy_with_one(batcher, model)
    doomed = submit(batcher, vector(5.0), timeout_s=0.05)
    # Do not wait through result(): the executor itself must answer the expired request.
    model.gate.set()
    with pytest.raises(DeadlineExceeded):
        doomed.future.result(timeout=5)
    batcher.close()


def test_model_failure_fails_its_batch_only_and_the_executor_lives_on() -> None:
    failing = Failing()
    batcher = make(failing)
    with pytest.raises(InferenceFailed, match="kernel exploded"):
        batcher.result(submit(batcher, vector(1.0)))
    with pytest.raises(InferenceFailed):
        batcher.result(submit(batcher, vector(1.0)))
    assert failing.calls == 2
    assert batcher.stats.failed == 2
    batcher.close()


def test_close_finishes_everything_accepted_and_refuses_newcomers() -> None:
    model = Gated()
    batcher = make(model, max_queue_delay_s=30.0)
    first = busy_with_one(batcher, model)
    queued = [submit(batcher, vector(float(i))) for i in range(3)]
    closed = threading.Event()
    result: list[bool] = []

    def close() -> None:
        result.append(batcher.close(timeout_s=30))
        closed.set()

    closer = threading.Thread(target=close)
    closer.start()
    # Closing is refused admission from the moment close() begins.
    deadline = time.monotonic() + 5
    while True:
        try:
            extra = submit(batcher, vector(9.0))
        except Unavailable as exc:
            assert exc.status == 503
            break
        batcher.result(extra) if model.gate.is_set() else queued.append(extra)
        assert time.monotonic() < deadline, "close() never stopped admission"
    assert not closed.is_set()
    model.gate.set()
    closer.join(10)
    assert result == [True]
    for pending in [first, *queued]:
        assert batcher.result(pending)["y"].shape == (1, 4)


def test_a_request_larger_than_the_batch_limit_is_refused_not_queued() -> None:
    batcher = make(Echo(), max_batch_size=4)
    with pytest.raises(InvalidInput, match="over the limit of 4"):
        submit(batcher, vector(1.0, batch=5))
    assert batcher.queue_depth == 0
    assert batcher.result(submit(batcher, vector(1.0, batch=4)))["y"].shape == (4, 4)
    batcher.close()


def test_batching_off_runs_each_request_alone_with_its_own_batch() -> None:
    model = Gated()
    batcher = make(model, combine=False)
    busy_with_one(batcher, model)
    queued = [submit(batcher, vector(1.0, batch=2)) for _ in range(3)]
    model.gate.set()
    for pending in queued:
        assert batcher.result(pending)["y"].shape == (2, 4)
    assert [b["x"].shape[0] for b in model.inner.batches] == [1, 2, 2, 2]
    batcher.close()


WIDE_SPEC = ModelSpec("wide", "1", (TensorSpec("x", "FP32", (-1, -1)),), (TensorSpec("y", "FP32", (-1, -1)),), 8)


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_requests_of_different_shapes_wait_in_their_own_groups() -> None:
    model = Gated()
    batcher = make(model, spec=WIDE_SPEC, max_queue_delay_s=0.05)
    first = submit(batcher, {"x": np.ones((1, 3), np.float32)})
    assert model.started.wait(5)
    queued = [submit(batcher, {"x": np.full((1, w), float(w), np.float32)}) for w in (3, 5, 3, 5, 7, 3)]
    model.gate.set()
    for pending, width in zip(queued, (3, 5, 3, 5, 7, 3)):
        np.testing.assert_array_equal(batcher.result(pending)["y"], np.full((1, width), 2.0 * width, np.float32))
    batcher.result(first)
    assert sorted(b["x"].shape for b in model.inner.batches) == [(1, 3), (1, 7), (2, 5), (3, 3)]
    batcher.close()


def test_the_oldest_requests_group_goes_first_once_due_so_a_rare_shape_is_not_starved() -> None:
    clock = ManualClock()
    model = Gated()
    batcher = make(model, spec=WIDE_SPEC, max_batch_size=4, max_queue_delay_s=0.05, clock=clock)
    first = submit(batcher, {"x": np.ones((1, 3), np.float32)})
    assert model.started.wait(5)
    rare = submit(batcher, {"x": np.ones((1, 9), np.float32)})
    common = [submit(batcher, {"x": np.ones((1, 3), np.float32)}) for _ in range(8)]
    clock.now = 1.0  # the rare request is past its delay before the executor looks again
    model.gate.set()
    for pending in [first, rare, *common]:
        batcher.result(pending)
    # Two full common groups were ready too, but the oldest request's group left first.
    assert [b["x"].shape for b in model.inner.batches] == [(1, 3), (1, 9), (4, 3), (4, 3)]
    batcher.close()


def test_a_full_group_of_another_shape_need_not_wait_for_the_oldest() -> None:
    model = Gated()
    batcher = make(model, spec=WIDE_SPEC, max_batch_size=4, max_queue_delay_s=30.0)
    first = submit(batcher, {"x": np.ones((1, 3), np.float32)})
    assert model.started.wait(5)
    submit(batcher, {"x": np.ones((1, 9), np.float32)}, timeout_s=60)
    common = [submit(batcher, {"x": np.ones((1, 3), np.float32)}) for _ in range(4)]
    model.gate.set()
    for pending in [first, *common]:
        batcher.result(pending)  # within the 30 s window: the full group left at once
    assert [b["x"].shape for b in model.inner.batches] == [(1, 3), (4, 3)]
    batcher.close()


def test_preferred_batch_sizes_dispatch_the_largest_that_can_be_formed() -> None:
    model = Gated()
    batcher = make(model, max_batch_size=8, max_queue_delay_s=30.0, preferred_batch_sizes=(2, 4))
    first = busy_with_one(batcher, model)
    queued = [submit(batcher, vector(float(i))) for i in range(5)]
    model.gate.set()
    for pending in [first, *queued[:4]]:
        batcher.result(pending)  # long before the 30 s window: 4 is preferred and could be formed
    assert [b["x"].shape[0] for b in model.inner.batches] == [1, 4]
    assert queued[0].batch_size == 4
    batcher.close()  # the fifth, alone and short of any preferred size, leaves when the batcher closes
    assert batcher.result(queued[4])["y"].shape == (1, 4)
    assert [b["x"].shape[0] for b in model.inner.batches] == [1, 4, 1]


def test_a_request_that_runs_alone_gets_its_outputs_whole() -> None:
    def no_batch_axis(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A model whose axis 0 is its own (max_batch_size 0): three rows for one request.
        return {"y": np.repeat(inputs["x"], 3, axis=0)}

    batcher = make(no_batch_axis)
    assert batcher.result(submit(batcher, vector(1.0)))["y"].shape == (3, 4)
    batcher.close()


class FailsOn:
    """Fail any batch that holds the value `bad`, naming it, like a runtime refusing one request's input."""

    def __init__(self, bad: float) -> None:
        self.bad = bad

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (inputs["x"] == self.bad).any():
            raise RuntimeError(f"cannot run value {self.bad}")
        return {"y": inputs["x"] * 2}


def test_bisection_isolates_one_bad_request_in_32_within_2_log2_n_extra_runs() -> None:
    runs = []
    for position in range(32):
        model = Gated(FailsOn(-1.0))
        batcher = make(model, max_batch_size=32, max_queue_delay_s=30.0)
        busy_with_one(batcher, model)
        values = [-1.0 if i == position else float(i) for i in range(32)]
        queued = [submit(batcher, vector(v)) for v in values]
        model.gate.set()
        for value, pending in zip(values, queued):
            if value == -1.0:
                with pytest.raises(InferenceFailed, match=r"cannot run value -1\.0"):
                    batcher.result(pending)
            else:
                np.testing.assert_array_equal(batcher.result(pending)["y"], np.full((1, 4), 2 * value, np.float32))
        assert pending.batch_size == 32 and batcher.stats.failed == 1
        runs.append(batcher.stats.bisect_runs)
        batcher.close()
    # Halving: one run per level when the left half runs clean (the right half must hold the fault,
    # so it is split without a run), two when it fails; the last level always runs both singles.
    assert (min(runs), max(runs), sum(runs) / len(runs)) == (6, 10, 8.0)


class Answers:
    """`on_done` for callers that must not block: records each answered request, in answer order."""

    def __init__(self) -> None:
        self.done: list = []
        self.event = threading.Event()

    def __call__(self, pending) -> None:
        self.done.append(pending)
        self.event.set()


def test_on_done_requests_are_queued_batched_and_answered_once_each() -> None:
    model = Gated()
    batcher = make(model)
    answers = Answers()
    first = busy_with_one(batcher, model)
    waiting = [batcher.submit(vector(float(i)), 1, 0, 30.0, on_done=answers) for i in range(3)]
    assert all(p.future is None for p in waiting)  # no Future: the answer comes through on_done
    with pytest.raises(RuntimeError, match="before the request was answered"):
        batcher.answer_of(waiting[0])
    model.gate.set()
    batcher.result(first)
    assert batcher.wait_idle(5)
    assert answers.done == waiting  # one call each, in queue order (they ran as one batch)
    assert [batcher.answer_of(p)["y"].ravel()[0] for p in waiting] == [0.0, 2.0, 4.0]  # Echo doubles
    assert {p.batch_size for p in waiting} == {3}
    batcher.close()


def test_on_done_is_used_even_when_idle_never_running_in_the_callers_thread() -> None:
    model = Echo()
    batcher = make(model)
    for _ in range(20):  # more than INLINE_AFTER idle arrivals: a caller_runs request would now run inline
        answers = Answers()
        pending = batcher.submit(vector(1.0), 1, 0, 30.0, caller_runs=True, on_done=answers)
        assert not pending.inline
        assert answers.event.wait(5)
        assert answers.done == [pending]
    batcher.close()


def test_expire_if_queued_refuses_a_waiting_request_and_leaves_a_running_one() -> None:
    model = Gated()
    recorder = Recorder()
    batcher = make(model, observer=recorder)
    answers = Answers()
    running = batcher.submit(vector(1.0), 1, 0, 30.0, on_done=answers)
    assert model.started.wait(5)
    queued = batcher.submit(vector(42.0), 1, 0, 30.0, on_done=answers)
    batcher.expire_if_queued(queued)
    batcher.expire_if_queued(running)  # already running: it finishes
    assert answers.done == [queued]
    with pytest.raises(DeadlineExceeded, match="not run"):
        batcher.answer_of(queued)
    assert batcher.queue_depth == 0
    model.gate.set()
    assert batcher.wait_idle(5)
    assert answers.done == [queued, running]
    assert batcher.answer_of(running)["y"].ravel()[0] == 2.0
    assert 42.0 not in np.concatenate([b["x"] for b in model.inner.batches])
    assert recorder.outcomes.count(RequestOutcome.TIMEOUT) == 1
    batcher.close()
