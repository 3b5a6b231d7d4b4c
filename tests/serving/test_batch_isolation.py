"""Batching that never breaks a request, over real ONNX Runtime sessions of models built with `onnx`.

Shape-safe grouping (mixed widths never concatenated), bisection of failed batches (only the bad
request fails, and no error shows another request's data), client errors counted apart from
server errors, and a rare shape never starved by a common one.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from serving.batching import Batcher, RequestOutcome
from serving.errors import InferenceFailed, InputRejected, ServingError
from serving.faults import is_input_fault, trim
from serving.runtime import CPU, Session
from serving.tensors import ModelSpec, TensorSpec
from tests.fakes import Failing, Gated

VOCAB = 50


def _session(nodes: list, inputs: list, outputs: list, initializers: list) -> Session:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # failing runs are the point here; keep ORT's own log quiet
    inner = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=[CPU])
    return Session(session=inner, provider=CPU, output_names=[o.name for o in inner.get_outputs()])


def ocr_model() -> tuple[Session, ModelSpec]:
    """A text-recognition-shaped model: images [-1, 3, 48, -1] -> per-column features [-1, 4, -1]."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c"], ["y"], axes=[2], keepdims=0),
    ]
    session = _session(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 48, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "w"])],
        [weight],
    )
    spec = ModelSpec(
        "ocr", "1", (TensorSpec("x", "FP32", (-1, 3, 48, -1)),), (TensorSpec("y", "FP32", (-1, 4, -1)),), 16
    )
    return session, spec


def embedding_model() -> tuple[Session, ModelSpec]:
    """A token classifier: ids [-1, -1] gathered from a VOCAB-row table and summed -> [-1, 4]."""
    table = numpy_helper.from_array(np.arange(VOCAB * 4, dtype=np.float32).reshape(VOCAB, 4), "table")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("ReduceSum", ["e", "axis"], ["y"], keepdims=0),
    ]
    axis = numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")
    session = _session(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [table, axis],
    )
    spec = ModelSpec(
        "tokens",
        "1",
        (TensorSpec("ids", "INT64", (-1, -1), sequence_axis=1, pad_value=0),),
        (TensorSpec("y", "FP32", (-1, 4)),),
        32,
        sequence_buckets=(8, 16),
    )
    return session, spec


def image(width: int, seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 48, width)).astype(np.float32)}


def tokens(ids: list[int]) -> dict[str, np.ndarray]:
    return {"ids": np.array([ids], dtype=np.int64)}


def submit(batcher: Batcher, tensors: dict[str, np.ndarray], seq_len: int = 0):
    return batcher.submit(tensors, next(iter(tensors.values())).shape[0], seq_len, 30.0)


class Recorder:
    def __init__(self) -> None:
        self.outcomes: list[RequestOutcome] = []

    def request_done(self, outcome, queue_s, compute_s, total_s) -> None:
        self.outcomes.append(outcome)

    def batch_done(self, size, real_tokens, padded_tokens, compute_s) -> None:
        pass

    def queue_changed(self, depth) -> None:
        pass


class Shapes:
    """Record the input shapes of every batch the model ran, around a real session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.shapes: list[tuple[int, ...]] = []
        self._lock = threading.Lock()

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.shapes.append(next(iter(inputs.values())).shape)
        return self.session.run(inputs)


def test_mixed_widths_are_batched_by_shape_and_each_equals_running_alone() -> None:
    session, spec = ocr_model()
    shapes = Shapes(session)
    model = Gated(shapes)
    batcher = Batcher(model, spec, max_batch_size=8, max_queue_delay_s=0.01, max_queue_size=64, instances=2)
    first = submit(batcher, image(48, 0))
    assert model.started.wait(5)
    # 36 requests, widths 48..640: four common widths (merged) and unique ones (alone).
    widths = [[48, 100, 320, 640][i % 4] if i % 3 else 48 + 17 * i for i in range(36)]
    requests = [image(w, seed) for seed, w in enumerate(widths, start=1)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        pending = list(pool.map(lambda r: submit(batcher, r), requests))
        model.gate.set()
        results = list(pool.map(batcher.result, pending))
    batcher.result(first)
    for request, result in zip(requests, results):
        np.testing.assert_allclose(result["y"], session.run(request)["y"], rtol=1e-5, atol=1e-5)
    assert max(shape[0] for shape in shapes.shapes) > 1  # merging did happen
    assert sum(shape[0] for shape in shapes.shapes) == 37  # and every request ran exactly once
    assert batcher.stats.failed == 0 and batcher.stats.bisect_runs == 0
    batcher.close()


def test_one_bad_request_fails_alone_and_bisection_stays_logarithmic() -> None:
    session, spec = embedding_model()
    model = Gated(session.run)
    recorder = Recorder()
    batcher = Batcher(model, spec, max_batch_size=32, max_queue_delay_s=0.01, max_queue_size=64, observer=recorder)
    first = submit(batcher, tokens([1]), 1)
    assert model.started.wait(5)
    good = [tokens([i % VOCAB, (3 * i) % VOCAB]) for i in range(31)]
    bad = tokens([4, 7777])
    queued = [submit(batcher, t, 2) for t in good[:13]] + [submit(batcher, bad, 2)]
    queued += [submit(batcher, t, 2) for t in good[13:]]
    model.gate.set()
    batcher.result(first)
    answers = []
    for p in queued:
        try:
            answers.append(batcher.result(p))
        except ServingError as exc:
            answers.append(exc)
    rejected = answers.pop(13)
    assert isinstance(rejected, InputRejected) and rejected.status == 400
    assert "idx=7777" in rejected.message and "/onnxruntime_src" not in rejected.message
    for request, answer in zip(good, answers):
        assert isinstance(answer, dict), answer
        np.testing.assert_array_equal(answer["y"], session.run(request)["y"])
    assert queued[0].batch_size == 32  # the bad one rode in a full batch, then was isolated
    assert 0 < batcher.stats.bisect_runs <= 2 * math.ceil(math.log2(32))
    assert batcher.stats.client_errors == 1 and batcher.stats.failed == 1
    assert recorder.outcomes.count(RequestOutcome.CLIENT_ERROR) == 1 and RequestOutcome.ERROR not in recorder.outcomes
    snapshot = batcher.snapshot()
    assert (snapshot.client_errors, snapshot.failed, snapshot.bisect_runs) == (1, 1, batcher.stats.bisect_runs)
    batcher.close()


def test_bad_requests_in_concurrent_traffic_see_only_their_own_error() -> None:
    session, spec = embedding_model()
    batcher = Batcher(session.run, spec, max_batch_size=16, max_queue_delay_s=0.005, max_queue_size=256, instances=2)
    bad_values = {i: 1000 + 37 * i for i in range(0, 200, 9)}  # 23 bad among 200

    def call(i: int) -> tuple[int, dict[str, np.ndarray] | ServingError]:
        ids = [i % VOCAB, bad_values[i]] if i in bad_values else [i % VOCAB, (7 * i) % VOCAB, 1][: 1 + i % 3]
        try:
            return i, batcher.result(submit(batcher, tokens(ids), len(ids)))
        except ServingError as exc:
            return i, exc

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = dict(pool.map(call, range(200)))
    for i, answer in answers.items():
        if i in bad_values:
            assert isinstance(answer, InputRejected), answer
            assert f"idx={bad_values[i]}" in answer.message
            others = [v for j, v in bad_values.items() if j != i]
            assert not any(str(v) in answer.message for v in others)
        else:
            assert isinstance(answer, dict), answer
    assert batcher.stats.client_errors == len(bad_values)
    assert batcher.stats.success == 200 - len(bad_values)
    batcher.close()


def test_a_model_fault_is_a_server_error_counted_apart_from_client_errors() -> None:
    recorder = Recorder()
    spec = ModelSpec("broken", "1", (TensorSpec("x", "FP32", (-1, 4)),), (TensorSpec("y", "FP32", (-1, 4)),), 8)
    batcher = Batcher(Failing(), spec, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=8, observer=recorder)
    with pytest.raises(InferenceFailed) as failed:
        batcher.result(submit(batcher, {"x": np.ones((1, 4), np.float32)}))
    assert failed.value.status == 500 and "kernel exploded" in failed.value.message
    assert (batcher.stats.failed, batcher.stats.client_errors) == (1, 0)
    assert recorder.outcomes == [RequestOutcome.ERROR]
    batcher.close()


def _broadcast_model() -> Session:
    """x [-1, -1] + a constant of width 5: any other width fails inside the graph (FAIL, not INVALID_ARGUMENT)."""
    five = numpy_helper.from_array(np.ones(5, dtype=np.float32), "five")
    return _session(
        [helper.make_node("Add", ["x", "five"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "w"])],
        [five],
    )


def _expand_model() -> Session:
    """Expand x to the shape given as an input: a huge shape fails to allocate (a server fault)."""
    return _session(
        [helper.make_node("Expand", ["x", "shape"], ["y"])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "w"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        [],
    )


def _own_reshape_model() -> Session:
    """Reshape a valid [n, 64] input to the graph's own impossible [7, 13]: a bug of the model, not the request."""
    shape = numpy_helper.from_array(np.array([7, 13], dtype=np.int64), "shape")
    return _session(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 13])],
        [shape],
    )


def _raised(call) -> Exception:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("the run did not fail")


def test_runtime_failures_are_classified_from_what_onnx_runtime_really_raises() -> None:
    session, _ = embedding_model()
    out_of_vocabulary = _raised(lambda: session.run(tokens([1, 99999])))
    assert is_input_fault(out_of_vocabulary)
    broadcast = _raised(lambda: _broadcast_model().run({"x": np.ones((1, 3), np.float32)}))
    assert type(broadcast).__name__ == "Fail" and is_input_fault(broadcast)
    assert trim(str(broadcast)).endswith("Attempting to broadcast an axis by a dimension other than 1. 3 by 5")
    huge = np.array([1 << 30, 1 << 30], dtype=np.int64)
    allocation = _raised(lambda: _expand_model().run({"x": np.ones((1, 1), np.float32), "shape": huge}))
    assert type(allocation).__name__ == "Fail" and not is_input_fault(allocation)
    own_reshape = _raised(lambda: _own_reshape_model().run({"x": np.ones((1, 64), np.float32)}))
    assert type(own_reshape).__name__ == "Fail" and not is_input_fault(own_reshape)
    assert not is_input_fault(RuntimeError("kernel exploded"))
    assert "bfc_arena.cc" not in trim(str(allocation))


def test_a_rare_shape_is_answered_under_a_steady_common_one() -> None:
    session, spec = ocr_model()
    batcher = Batcher(session.run, spec, max_batch_size=4, max_queue_delay_s=0.02, max_queue_size=64)
    stop = threading.Event()
    served_after_rare = [0]
    rare_sent = threading.Event()

    def common_traffic() -> None:
        while not stop.is_set():
            batcher.result(submit(batcher, image(64, 0)))
            if rare_sent.is_set():
                served_after_rare[0] += 1

    feeders = [threading.Thread(target=common_traffic) for _ in range(24)]  # always a full group waiting
    for feeder in feeders:
        feeder.start()
    try:
        rare = submit(batcher, image(600, 1))
        rare_sent.set()
        result = rare.future.result(timeout=10)
    finally:
        stop.set()
        for feeder in feeders:
            feeder.join(10)
    np.testing.assert_allclose(result["y"], session.run(image(600, 1))["y"], rtol=1e-5, atol=1e-5)
    assert served_after_rare[0] > 0  # the common shape kept flowing meanwhile
    batcher.close()
