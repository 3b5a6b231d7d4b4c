"""Which requests may share a batch, and how their tensors are joined and split again.

Requests are merged only when every input has the same non-batch shape, or differs only along its
declared sequence axis within one length bucket (then padded to the longest member), so a batch
never concatenates shapes ONNX Runtime would refuse to join. Pure functions over numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving.tensors import ModelSpec

# (bucket, per input: its shape after the batch axis, the sequence axis blanked to -1)
GroupKey = tuple[int, tuple[tuple[int, ...], ...]]


@dataclass(frozen=True)
class Part:
    """One request's share of a batch: its tensors, samples and sequence length."""

    tensors: dict[str, np.ndarray]
    batch: int
    seq_len: int


@dataclass(frozen=True)
class Assembled:
    """A batch ready to run, and the sequence figures it was padded to."""

    inputs: dict[str, np.ndarray]
    length: int  # longest sequence in the batch (0 without a sequence axis)
    real_tokens: int
    padded_tokens: int


def group_key(spec: ModelSpec, tensors: dict[str, np.ndarray], bucket: int) -> GroupKey:
    """Return the key that requests must share to be merged into one batch."""
    shapes = []
    for t in spec.inputs:
        shape = list(tensors[t.name].shape[1:])
        if t.sequence_axis is not None and 0 < t.sequence_axis <= len(shape):
            shape[t.sequence_axis - 1] = -1
        shapes.append(tuple(shape))
    return bucket, tuple(shapes)


def assemble(spec: ModelSpec, parts: Sequence[Part]) -> Assembled:
    """Concatenate along the batch axis, right-padding sequence axes to the longest member."""
    length = max(p.seq_len for p in parts)
    real = sum(p.batch * p.seq_len for p in parts)
    padded = sum(p.batch for p in parts) * length
    if len(parts) == 1:
        return Assembled(parts[0].tensors, length, real, padded)
    inputs = {}
    for t in spec.inputs:
        arrays = []
        for p in parts:
            array = p.tensors[t.name]
            if t.sequence_axis is not None and array.shape[t.sequence_axis] < length:
                widths = [(0, 0)] * array.ndim
                widths[t.sequence_axis] = (0, length - array.shape[t.sequence_axis])
                array = np.pad(array, widths, constant_values=t.pad_value)
            arrays.append(array)
        inputs[t.name] = np.concatenate(arrays, axis=0)
    return Assembled(inputs, length, real, padded)


def split(
    spec: ModelSpec, outputs: dict[str, np.ndarray], offset: int, part: Part, length: int, alone: bool
) -> dict[str, np.ndarray]:
    """Return one request's slice of a batch's outputs, its sequence axes cut back to its own length.

    A request that ran alone gets the outputs whole: for a model without a batch axis
    (`max_batch_size: 0`) axis 0 is the model's own, and slicing it would cut real data.
    """
    if alone:
        return dict(outputs)
    by_name = {t.name: t for t in spec.outputs}
    result = {}
    for name, array in outputs.items():
        piece = array[offset : offset + part.batch]
        declared = by_name.get(name)
        if declared is not None and declared.sequence_axis is not None and part.seq_len < length:
            piece = np.take(piece, np.arange(part.seq_len), axis=declared.sequence_axis)
        result[name] = piece
    return result
