"""A caller who waits for its own answer runs it itself when the batcher is idle, within the same limits."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from serving.batching import INLINE_AFTER, Batcher, RequestOutcome
from serving.errors import DeadlineExceeded, InferenceFailed, Unavailable
from tests.fakes import VECTOR_SPEC, Echo, Failing, Gated, vector
from tests.serving.test_batching import Recorder


class Watched:
    """Run `inner`, remembering which thread ran each batch and the most batches ever in flight at once."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.threads: list[int] = []
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.threads.append(threading.get_ident())
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return self.inner(inputs)
        finally:
            with self._lock:
                self.in_flight -= 1


def make(run, **kw) -> Batcher:
    options = {"max_batch_size": 8, "max_queue_delay_s": 0.05, "max_queue_size": 64, "instances": 1}
    options.update(kw)
    return Batcher(run, VECTOR_SPEC, **options)


def call(batcher: Batcher, tensors: dict) -> dict[str, np.ndarray]:
    """Submit as Engine.infer does and wait for the answer."""
    pending = batcher.submit(tensors, tensors["x"].shape[0], 0, 30.0, caller_runs=True)
    return batcher.result(pending)


def test_an_idle_batcher_lets_the_caller_run_its_request_and_counts_it_as_any_run() -> None:
    model, recorder = Watched(Echo()), Recorder()
    batcher = make(model, observer=recorder, max_queue_delay_s=30.0)
    result = call(batcher, vector(1.5))
    np.testing.assert_array_equal(result["y"], np.full((1, 4), 3.0, dtype=np.float32))
    assert model.threads == [threading.get_ident()]
    assert (batcher.stats.success, batcher.stats.execution_count, batcher.stats.inference_count) == (1, 1, 1)
    assert recorder.outcomes == [RequestOutcome.SUCCESS] and recorder.batches == [(1, 0, 0)]
    assert not batcher.busy
    assert batcher.close(5)


def test_requests_arriving_during_an_inline_run_queue_and_then_go_together_never_beside_it() -> None:
    gated = Gated()
    model = Watched(gated)
    batcher = make(model)
    first: dict = {}
    caller = threading.Thread(target=lambda: first.update(call(batcher, vector(1.0))))
    caller.start()
    assert gated.started.wait(5)
    # The only instance is the caller's: these two must wait in the queue, not run beside it.
    queued = [batcher.submit(vector(v), 1, 0, 30.0, caller_runs=True) for v in (2.0, 3.0)]
    assert not any(p.inline for p in queued) and batcher.queue_depth == 2
    gated.gate.set()
    caller.join(5)
    answers = [batcher.result(p)["y"][0, 0] for p in queued]
    assert first["y"][0, 0] == 2.0 and answers == [4.0, 6.0]
    assert [b["x"].shape[0] for b in gated.inner.batches] == [1, 2]
    assert model.most_in_flight == 1
    assert batcher.close(5)


def test_close_waits_for_an_inline_run_and_refuses_newcomers_meanwhile() -> None:
    gated = Gated()
    batcher = make(gated)
    answers: list = []
    caller = threading.Thread(target=lambda: answers.append(call(batcher, vector(1.0))))
    caller.start()
    assert gated.started.wait(5)
    assert batcher.close(0.05) is False  # the inline run still holds its instance
    with pytest.raises(Unavailable):
        call(batcher, vector(2.0))
    gated.gate.set()
    caller.join(5)
    assert answers[0]["y"][0, 0] == 2.0
    assert batcher.close(5) is True and not batcher.busy


def test_an_inline_run_that_fails_answers_with_the_server_error_and_is_counted() -> None:
    recorder = Recorder()
    batcher = make(Failing(), observer=recorder)
    with pytest.raises(InferenceFailed, match="kernel exploded"):
        call(batcher, vector(1.0))
    assert (batcher.stats.failed, batcher.stats.client_errors) == (1, 0)
    assert recorder.outcomes == [RequestOutcome.ERROR]
    # The instance came back: the next request runs too.
    with pytest.raises(InferenceFailed):
        call(batcher, vector(1.0))
    assert batcher.stats.failed == 2 and not batcher.busy
    assert batcher.close(5)


def test_after_requests_queued_callers_run_inline_again_only_once_enough_found_the_batcher_idle() -> None:
    gated = Gated()
    model = Watched(gated)
    batcher = make(model)
    caller = threading.Thread(target=lambda: call(batcher, vector(1.0)))
    caller.start()
    assert gated.started.wait(5)
    queued = batcher.submit(vector(2.0), 1, 0, 30.0, caller_runs=True)  # contention: the batcher is loaded
    gated.gate.set()
    caller.join(5)
    batcher.result(queued)
    inline = []
    for _ in range(INLINE_AFTER + 1):
        assert batcher.wait_idle(5)  # each request finds the batcher idle
        pending = batcher.submit(vector(3.0), 1, 0, 30.0, caller_runs=True)
        assert batcher.result(pending)["y"][0, 0] == 6.0
        inline.append(pending.inline)
    # Right after the load, requests go through the executor, where later arrivals could join them.
    assert inline == [False] * INLINE_AFTER + [True]
    assert model.threads[-2] != threading.get_ident() == model.threads[-1]
    assert batcher.close(5)


def test_a_caller_past_its_deadline_before_its_inline_run_starts_gets_a_timeout_and_never_runs() -> None:
    now = [100.0]
    model, recorder = Watched(Echo()), Recorder()
    batcher = make(model, observer=recorder, clock=lambda: now[0])
    pending = batcher.submit(vector(1.0), 1, 0, 0.5, caller_runs=True)
    assert pending.inline
    now[0] += 1.0  # the caller reaches result() after its deadline
    with pytest.raises(DeadlineExceeded, match="not run"):
        batcher.result(pending)
    assert model.threads == [] and batcher.stats.timeouts == 1 and recorder.outcomes == [RequestOutcome.TIMEOUT]
    assert not batcher.busy
    assert batcher.close(5)
