"""Batch limits from the cost curve: the choice, the batcher keeping to it, and real ONNX Runtime models timed at load.

Two small models built with the `onnx` package have curves of known shape on any CPU: `flat` does
the same elementwise work for every sample (cost per sample does not fall with the batch), `fixed`
does one matrix chain per run on the first sample alone (cost per sample halves with each doubling).
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from serving.batchcost import CostCurve, batch_sizes, choose_limit, limit_for
from serving.engine import Engine
from serving.modelconfig import triton_config
from serving.settings import BatchingSettings, RuntimeSettings
from tests.fakes import SEQUENCE_SPEC, Gated, SequenceSum, sequence, vector
from tests.serving.test_batching import busy_with_one, make, submit

WIDTH = 16384  # the flat model's values per sample: its per-run overhead (~3 µs a node) is then ~2 %
HIDDEN = 384  # the fixed model's matrix size


def _save(
    folder: Path, graph: onnx.GraphProto, name: str, width: int, max_batch_size: int, preferred: tuple[int, ...] = ()
) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="flightdeck-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    manifest = {
        "name": name,
        "version": "1",
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, width]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
        "batching": {"max_batch_size": max_batch_size, "preferred_batch_sizes": list(preferred)},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def write_flat(folder: Path, max_batch_size: int = 16, preferred: tuple[int, ...] = ()) -> Path:
    """y = sum(sin(cos(...(x)))): 12 elementwise passes over every sample's WIDTH values."""
    nodes, last = [], "x"
    for i in range(12):
        out = f"h{i}"
        nodes.append(helper.make_node("Sin" if i % 2 else "Cos", [last], [out]))
        last = out
    nodes.append(helper.make_node("ReduceSum", [last, "axes"], ["y"], keepdims=1))
    graph = helper.make_graph(
        nodes,
        "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        initializer=[numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")],
    )
    return _save(folder, graph, "flat", WIDTH, max_batch_size, preferred)


def write_fixed(folder: Path, max_batch_size: int = 16) -> Path:
    """y = sum(x) + a chain of 8 HIDDEN x HIDDEN matrix products over the first sample alone: one cost per run."""
    rng = np.random.default_rng(0)
    init = [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
    ]
    nodes = [helper.make_node("Slice", ["x", "zero", "one", "zero"], ["first"])]  # x[0:1], shape [1, HIDDEN]
    last = "first"
    for i in range(8):
        init.append(
            numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) / HIDDEN).astype(np.float32), f"w{i}")
        )
        nodes += [
            helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]),
        ]
        last = f"t{i}"
    nodes += [
        helper.make_node("ReduceSum", [last], ["fixed"], keepdims=0),  # a scalar
        helper.make_node("ReduceSum", ["x", "one"], ["rows"], keepdims=1),
        helper.make_node("Add", ["rows", "fixed"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        initializer=init,
    )
    return _save(folder, graph, "fixed", HIDDEN, max_batch_size)


def learning_engine(**batching) -> Engine:
    settings = BatchingSettings(learn_batch_limits=True, instances=1, max_queue_delay_ms=50.0, **batching)
    return Engine(RuntimeSettings(device="cpu", intra_op_threads=1), settings, rng=random.Random(1))


# -- the choice ---------------------------------------------------------------------------------


def test_the_limit_is_the_smallest_batch_within_the_margin_of_the_best() -> None:
    # Raw ONNX Runtime, demo text classifier at 64 tokens (docs/benchmarks.md): ms per sample 2.21, 1.83,
    # 1.64, 1.38, 1.33, 1.36 at batch 1..32. Batch 16 is 4 % cheaper per sample than 8 for twice the wait.
    per_sample = [2.21, 1.83, 1.64, 1.38, 1.33, 1.36]
    points = [(b, b * ms / 1000) for b, ms in zip(batch_sizes(32), per_sample)]
    assert choose_limit(points, 0.1) == 8
    assert choose_limit(points, 0.03) == 16
    assert choose_limit(points, 0.5) == 2


def test_the_limit_is_never_one_where_two_was_measured() -> None:
    # A flat curve (the same cost per sample at every size): merging still shares the server's cost of a run.
    flat = [(b, b * 0.005) for b in batch_sizes(32)]
    assert choose_limit(flat, 0.05) == 2
    assert choose_limit(flat[:3], 0.05) == 2
    assert choose_limit(flat[:2], 0.05) is None  # 2 is the largest measured: the max batch size bounds it
    assert choose_limit(flat[:1], 0.05) is None


def test_a_curve_still_falling_at_its_last_size_bounds_nothing() -> None:
    halving = [(b, 0.004) for b in batch_sizes(32)]  # one cost per run: per sample it halves each time
    assert choose_limit(halving, 0.1) is None
    assert choose_limit(halving[:3], 0.1) is None  # cut short while still paying
    assert choose_limit([], 0.1) is None
    assert batch_sizes(24) == [1, 2, 4, 8, 16, 24] and batch_sizes(1) == [1]


def test_a_bucket_takes_the_limit_of_the_nearest_measured_bucket_at_or_above_it() -> None:
    limits = {32: 16, 128: 4}
    assert [limit_for(limits, b) for b in (16, 32, 64, 128, 512)] == [16, 16, 4, 4, 4]
    assert limit_for({}, 16) is None


def test_limits_under_a_max_batch_size_and_the_curve_as_people_read_it() -> None:
    curve = CostCurve({128: ((1, 0.01), (2, 0.02), (4, 0.04)), 16: ((1, 0.002),)}, {128: 1, 16: None}, 0.1, 0.5)
    assert curve.limits_under(8) == {128: 1, 16: 8}
    assert curve.limits_under(1) == {128: 1, 16: 1}
    assert curve.describe() == {"16": {"1": 2.0}, "128": {"1": 10.0, "2": 10.0, "4": 10.0}}


# -- the batcher keeps to it --------------------------------------------------------------------


def test_the_batcher_merges_no_more_than_the_limit_and_a_larger_request_still_runs() -> None:
    model = Gated()
    batcher = make(model, max_queue_delay_s=30.0, batch_limits={0: 3})
    first = busy_with_one(batcher, model)
    # Three requests are a full batch under the limit: they would leave at once, not after 30 s.
    queued = [submit(batcher, vector(float(i))) for i in range(7)]
    big = submit(batcher, vector(9.0, batch=5))  # over the limit, within max_batch_size 8: runs alone
    model.gate.set()
    for pending in queued + [big, first]:
        batcher.result(pending)
    assert [b["x"].shape[0] for b in model.inner.batches] == [1, 3, 3, 1, 5]
    assert big.batch_size == 5
    batcher.close()


def test_each_bucket_keeps_its_own_limit_and_reconfigure_replaces_them() -> None:
    model = Gated(SequenceSum())
    batcher = make(model, spec=SEQUENCE_SPEC, max_queue_delay_s=30.0, batch_limits={4: 4, 16: 2})
    first = batcher.submit(sequence([1, 2]), 1, 2, 30)
    assert model.started.wait(5)
    short = [batcher.submit(sequence([1, 2, 3]), 1, 3, 30) for _ in range(4)]  # bucket 4
    long = [batcher.submit(sequence(list(range(1, 13))), 1, 12, 30) for _ in range(4)]  # bucket 16
    model.gate.set()
    for pending in [first, *short, *long]:
        batcher.result(pending)
    assert [p.batch_size for p in short] == [4] * 4
    assert [p.batch_size for p in long] == [2] * 4
    batcher.reconfigure(max_batch_size=8, max_queue_delay_s=30.0, max_queue_size=64, batch_limits={})
    assert batcher.batch_limits == {}
    batcher.close()


# -- timed at load, on real ONNX Runtime sessions -----------------------------------------------


def test_a_model_whose_cost_per_sample_does_not_fall_is_bounded_at_a_small_batch(tmp_path: Path) -> None:
    engine = learning_engine(max_batch_size=32)
    try:
        loaded = engine.load(write_flat(tmp_path / "flat", max_batch_size=32))
        curve = loaded.config.cost_curve
        assert curve is not None and set(curve.points) == {0}
        limit = loaded.config.batch_limits[0]
        # The same work per sample at every size: 2 on a quiet machine (never 1: choose_limit); on this shared VM
        # the thread's CPU time per sample has measured up to 30 % lower at batch 8 than at 1 (other processes).
        assert 2 <= limit <= 8, curve.describe()
        assert loaded.batcher.batch_limits == {0: limit}
        # Under concurrency no batch is larger than the limit; a request of 16 rows still runs, alone.
        x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
        with ThreadPoolExecutor(12) as pool:
            routed = list(pool.map(lambda _: engine.infer("flat", {"x": x}), range(48)))
        assert max(r.batch_size for r in routed) <= limit
        big = engine.infer("flat", {"x": np.repeat(x, 16, axis=0)})
        assert big.batch_size == 16 and big.outputs["y"].shape == (16, 1)
        np.testing.assert_allclose(big.outputs["y"], np.repeat(routed[0].outputs["y"], 16, axis=0), rtol=1e-5)
    finally:
        engine.drain(10)


def test_a_models_own_preferred_batch_size_is_not_bounded_away_by_the_curve(tmp_path: Path) -> None:
    engine = learning_engine(max_batch_size=32)
    try:
        # The flat model's curve bounds it at a small batch (above); its manifest asks for batches of 16.
        loaded = engine.load(write_flat(tmp_path / "flat", max_batch_size=32, preferred=(4, 16)))
        assert loaded.config.cost_curve is not None
        assert loaded.config.batch_limits == {0: 16} and loaded.batcher.batch_limits == {0: 16}
        engine.set_batching(max_batch_size=8)  # the engine-wide cap still bounds it, and drops the 16
        (loaded,) = engine.loaded("flat")
        assert loaded.config.preferred_batch_sizes == (4,) and loaded.config.batch_limits[0] in (4, 8)
    finally:
        engine.drain(10)


def test_a_model_with_one_cost_per_run_is_not_bounded(tmp_path: Path) -> None:
    engine = learning_engine(max_batch_size=16)
    try:
        loaded = engine.load(write_fixed(tmp_path / "fixed"))
        curve = loaded.config.cost_curve
        assert curve is not None and curve.limits == {0: None}, curve.describe()
        assert [b for b, _ in curve.points[0]] == [1, 2, 4, 8, 16]
        assert loaded.config.batch_limits == {0: 16}
    finally:
        engine.drain(10)


def test_the_limits_follow_the_engine_max_and_show_in_the_config(tmp_path: Path) -> None:
    engine = learning_engine(max_batch_size=16)
    try:
        engine.load(write_fixed(tmp_path / "fixed"))
        engine.set_batching(max_batch_size=4)
        (loaded,) = engine.loaded("fixed")
        assert loaded.config.batch_limits == {0: 4} and loaded.batcher.batch_limits == {0: 4}
        engine.set_batching(max_batch_size=16)
        (loaded,) = engine.loaded("fixed")
        assert loaded.batcher.batch_limits == {0: 16}  # the same curve, measured once at load
        config = triton_config(loaded.spec, loaded.config, on_gpu=False)
        assert config["max_batch_size"] == 16  # what a request may carry; the limit is on merging
        assert config["parameters"]["batch_limits"] == {"string_value": "0:16"}
        shown = json.loads(config["parameters"]["batch_cost_ms_per_sample"]["string_value"])
        assert list(shown) == ["0"] and list(shown["0"]) == ["1", "2", "4", "8", "16"]
        assert shown["0"]["16"] < shown["0"]["1"]
    finally:
        engine.drain(10)


def test_off_by_default_in_the_library_and_for_a_model_without_a_batch_axis(tmp_path: Path) -> None:
    engine = Engine(RuntimeSettings(device="cpu", intra_op_threads=1), BatchingSettings(instances=1))
    learning = learning_engine()
    try:
        loaded = engine.load(write_flat(tmp_path / "flat"))
        assert loaded.config.cost_curve is None and loaded.batcher.batch_limits == {}
        assert "batch_limits" not in triton_config(loaded.spec, loaded.config, on_gpu=False).get("parameters", {})
        unbatched = learning.load(write_flat(tmp_path / "unbatched", max_batch_size=0))
        assert unbatched.config.cost_curve is None
    finally:
        engine.drain(10)
        learning.drain(10)


def test_a_text_model_is_timed_per_sequence_bucket(demo_store: Path) -> None:
    engine = learning_engine(max_batch_size=8, warmup_max_sequence=32)
    try:
        loaded = engine.load(demo_store / "textcls" / "1")
        curve = loaded.config.cost_curve
        assert curve is not None and set(curve.points) <= {16, 32} and 32 in curve.points, curve.describe()
        assert set(loaded.config.batch_limits) == set(curve.points)
        assert all(1 <= limit <= 8 for limit in loaded.config.batch_limits.values())
    finally:
        engine.drain(10)
