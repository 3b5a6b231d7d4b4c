"""The engine over models with real-world signatures: scalars, strings, no batch axis, images of any size.

Real ONNX Runtime sessions over small graphs built in tests/signature_models.py; results compared
with the numpy reference of what each graph computes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from serving.engine import Engine
from serving.errors import InputRejected, InvalidInput
from serving.settings import BatchingSettings
from tests.signature_models import (
    ONNX_TYPES,
    image_reference,
    sample_of,
    strings_reference,
    vad_reference,
    write_alltypes,
    write_image,
    write_strings,
    write_vad,
)


@pytest.fixture
def engine():
    eng = Engine(batching=BatchingSettings(max_queue_delay_ms=20.0))
    yield eng
    eng.drain(10)


def vad_inputs(batch: int, samples: int, seed: int = 0, sr: int = 16000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input": rng.standard_normal((batch, samples)).astype(np.float32),
        "state": rng.standard_normal((2, batch, 8)).astype(np.float32),
        "sr": np.array(sr, dtype=np.int64),
    }


def run_together(engine: Engine, name: str, requests: list[dict[str, np.ndarray]]) -> list:
    """Submit every request at once from its own thread and return the outcomes in order."""
    start = threading.Barrier(len(requests))

    def one(tensors: dict[str, np.ndarray]):
        start.wait()
        return engine.infer(name, tensors)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


# -- no batch axis (max_batch_size 0), scalars ------------------------------------------------


def test_a_model_without_a_batch_axis_runs_each_request_alone_with_its_own_shapes(
    engine: Engine, tmp_path: Path
) -> None:
    loaded = engine.load(write_vad(tmp_path / "vad"))
    assert (loaded.config.combine, loaded.batcher.max_batch_size, loaded.batcher.combine) == (False, 1, False)
    # Batch sizes on axis 0 of input and axis 1 of state; merging them along axis 0 would break the state.
    requests = [vad_inputs(batch, 10 + 3 * i, seed=i) for i, batch in enumerate([1, 3, 2, 1, 4, 2])]
    for routed, tensors in zip(run_together(engine, "vad", requests), requests):
        expected = vad_reference(tensors["input"], tensors["state"], tensors["sr"])
        assert routed.batch_size == 1
        for key, want in expected.items():
            assert routed.outputs[key].shape == want.shape  # whole: the scalar stays a scalar
            np.testing.assert_allclose(routed.outputs[key], want, rtol=1e-5, atol=1e-4)
    assert set(loaded.batcher.stats.batch_sizes) == {1}


def test_scalar_and_state_shapes_are_validated_per_request(engine: Engine, tmp_path: Path) -> None:
    engine.load(write_vad(tmp_path / "vad"))
    bad_rate = {**vad_inputs(1, 8), "sr": np.array([16000], dtype=np.int64)}
    with pytest.raises(InvalidInput, match=r"input 'sr' has shape \[1\], model expects rank 0 shape \[\]"):
        engine.infer("vad", bad_rate)
    bad_state = {**vad_inputs(2, 8), "state": np.zeros((2, 2, 7), np.float32)}
    with pytest.raises(InvalidInput, match=r"axis 2 must be 8"):
        engine.infer("vad", bad_state)
    with pytest.raises(InvalidInput, match="input 'sr' has datatype INT32, model expects INT64"):
        engine.infer("vad", {**vad_inputs(1, 8), "sr": np.array(8000, dtype=np.int32)})
    # A first axis of any size is fine: it is no batch axis, so no batch limit applies.
    routed = engine.infer("vad", vad_inputs(40, 8))
    assert routed.outputs["stateN"].shape == (2, 40, 8)


# -- strings ------------------------------------------------------------------------------------


def test_string_tensors_go_in_and_come_out_as_object_arrays_of_str(engine: Engine, tmp_path: Path) -> None:
    engine.load(write_strings(tmp_path / "strings"))
    texts = [["yes", "no"], ["héllo"], ["", "yes", "Ω"], ["maybe"]]
    requests = [{"text": np.array(t, dtype=object)} for t in texts]
    for routed, tensors in zip(run_together(engine, "strings", requests), requests):
        expected = strings_reference(tensors["text"])
        assert routed.outputs["marked"].dtype == object
        assert routed.outputs["marked"].tolist() == expected["marked"].tolist()
        np.testing.assert_array_equal(routed.outputs["is_yes"], expected["is_yes"])
        np.testing.assert_array_equal(routed.outputs["ids"], expected["ids"])


def test_a_string_tensor_must_hold_strings(engine: Engine, tmp_path: Path) -> None:
    engine.load(write_strings(tmp_path / "strings"))
    with pytest.raises(InvalidInput, match="input 'text' is BYTES: every element must be a string"):
        engine.infer("strings", {"text": np.array(["yes", 3], dtype=object)})
    with pytest.raises(InvalidInput, match="BYTES takes an object array of str"):
        engine.infer("strings", {"text": np.array(["yes"])})  # a numpy unicode array, not object


# -- images of any height and width -------------------------------------------------------------


def test_an_image_model_with_dynamic_height_and_width_loads_without_guessing_a_warm_up_shape(
    engine: Engine, tmp_path: Path
) -> None:
    # A 1x1 image, what a guessed warm-up would send, is refused by the 3x3 convolution.
    loaded = engine.load(write_image(tmp_path / "image"))
    assert loaded.sample is None  # no declared warm-up, and no inferred one for unknowable shapes
    sizes = [(5, 7), (9, 4), (5, 7), (16, 16), (3, 3), (9, 4)]
    rng = np.random.default_rng(2)
    requests = [
        {"image": rng.standard_normal((1 + i % 2, 3, h, w)).astype(np.float32)} for i, (h, w) in enumerate(sizes)
    ]
    for routed, tensors in zip(run_together(engine, "image", requests), requests):
        expected = image_reference(tensors["image"])
        for key, want in expected.items():
            assert routed.outputs[key].shape == want.shape
            np.testing.assert_allclose(routed.outputs[key], want, rtol=1e-4, atol=1e-4)
    # A request too small for the kernel fails alone, as the client's fault.
    with pytest.raises(InputRejected):
        engine.infer("image", {"image": np.zeros((1, 3, 1, 1), np.float32)})


def test_declared_warm_up_samples_run_at_load_and_must_succeed(engine: Engine, tmp_path: Path) -> None:
    warmup = [{"inputs": {"image": {"shape": [2, 3, 12, 10], "fill": "random"}}, "count": 2}]
    loaded = engine.load(write_image(tmp_path / "ok", warmup=warmup))
    assert loaded.sample is not None and loaded.sample["image"].shape == (2, 3, 12, 10)
    assert loaded.batcher.stats.execution_count == 0  # warm-up is not traffic
    failing = [{"inputs": {"image": {"shape": [1, 3, 1, 1]}}}]
    with pytest.raises(ValueError, match="declared warm-up sample 0 failed"):
        engine.load(write_image(tmp_path / "bad", warmup=failing), "green")
    assert [v.slot for v in engine.loaded("image")] == ["blue"]  # the failed load published nothing


# -- per-model configuration --------------------------------------------------------------------


def test_a_models_own_batching_values_override_the_engines_and_the_engine_caps_batch_size(
    engine: Engine, tmp_path: Path
) -> None:
    own = {
        "max_batch_size": 6,
        "max_queue_delay_ms": 7,
        "max_queue_size": 9,
        "preferred_batch_sizes": [2, 4],
        "default_timeout_ms": 1234,
        "instances": 1,
    }
    image = engine.load(write_image(tmp_path / "image", batching=own))
    plain = engine.load(write_alltypes(tmp_path / "alltypes"))
    b = image.batcher
    assert (b.max_batch_size, b.max_queue_delay_s, b.max_queue_size, b.preferred_batch_sizes) == (6, 0.007, 9, (2, 4))
    assert (image.config.instances, image.config.default_timeout_s) == (1, 1.234)
    assert (plain.batcher.max_batch_size, plain.batcher.max_queue_delay_s, plain.batcher.max_queue_size) == (
        32,
        0.02,
        128,
    )
    # The runbook knob: the engine's batch size caps every model; a model's own delay and queue stay.
    engine.set_batching(max_batch_size=3, max_queue_delay_ms=50, max_queue_size=500)
    assert (b.max_batch_size, b.max_queue_delay_s, b.max_queue_size) == (3, 0.007, 9)
    assert image.config.preferred_batch_sizes == (2,)
    assert (plain.batcher.max_batch_size, plain.batcher.max_queue_delay_s, plain.batcher.max_queue_size) == (
        3,
        0.05,
        500,
    )
    engine.set_batching(max_batch_size=64)
    assert b.max_batch_size == 6  # never past the model's own


# -- every datatype -----------------------------------------------------------------------------


def test_every_datatype_goes_through_the_engine_unchanged(engine: Engine, tmp_path: Path) -> None:
    engine.load(write_alltypes(tmp_path / "alltypes"))
    tensors = {f"in_{d}": sample_of(d, batch=3, seed=1) for d in ONNX_TYPES}
    routed = engine.infer("alltypes", tensors)
    for d in ONNX_TYPES:
        got, want = routed.outputs[f"out_{d}"], tensors[f"in_{d}"]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tolist() == want.tolist()
