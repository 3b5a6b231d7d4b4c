"""Fake models for batcher and engine tests: a RunBatch callable per behaviour (MLServer's idea)."""

from __future__ import annotations

import threading

import numpy as np

from serving.tensors import ModelSpec, TensorSpec

VECTOR_SPEC = ModelSpec(
    name="echo",
    version="1",
    inputs=(TensorSpec("x", "FP32", (-1, 4)),),
    outputs=(TensorSpec("y", "FP32", (-1, 4)),),
    max_batch_size=8,
)

SEQUENCE_SPEC = ModelSpec(
    name="seq",
    version="1",
    inputs=(
        TensorSpec("ids", "INT64", (-1, -1), sequence_axis=1, pad_value=0),
        TensorSpec("mask", "INT64", (-1, -1), sequence_axis=1, pad_value=0),
    ),
    outputs=(TensorSpec("total", "INT64", (-1, 1)), TensorSpec("tokens", "INT64", (-1, -1), sequence_axis=1)),
    max_batch_size=8,
    sequence_buckets=(4, 8, 16),
)


class Echo:
    """Return the input doubled and remember every batch it ran."""

    def __init__(self) -> None:
        self.batches: list[dict[str, np.ndarray]] = []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(inputs)
        return {"y": inputs["x"] * 2}


class SequenceSum:
    """Sum ids under the mask (so padding must not change it) and echo the tokens."""

    def __init__(self) -> None:
        self.batches: list[dict[str, np.ndarray]] = []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(inputs)
        total = (inputs["ids"] * inputs["mask"]).sum(axis=1, keepdims=True)
        return {"total": total, "tokens": inputs["ids"].copy()}


class Gated:
    """Block every batch until the test opens the gate; `started` is set when a batch begins."""

    def __init__(self, inner=None) -> None:
        self.inner = inner or Echo()
        self.started = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        self.started.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("test never opened the gate")
        return self.inner(inputs)


class Failing:
    """Raise on every batch, like a model with a broken kernel."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        raise RuntimeError("kernel exploded")


def vector(value: float, batch: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((batch, 4), value, dtype=np.float32)}


def sequence(ids: list[int]) -> dict[str, np.ndarray]:
    array = np.array([ids], dtype=np.int64)
    return {"ids": array, "mask": np.ones_like(array)}
