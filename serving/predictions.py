"""Predicted labels of a model's answers, counted per version so a canary's answers can be compared.

A classifier-like output (floating point, one row of scores per sample: shape [batch, classes])
counts the arg-max of its last axis; an integer or BYTES output with one value per sample (shape
[batch] or [batch, 1]) counts that value; a floating-point output with one value per sample (a
score, a regression) counts the octave its value falls in ("[0.25,0.5)", "0", "(-2,-1]"): a
histogram of values with edges every version shares. Other outputs (embeddings, sequences,
images) are not counted. Cardinality is bounded: per output, the first `MAX_LABELS` distinct labels a version
answers are kept by name and every later one counts as `OTHER`. For a classifier of up to
`MAX_LABELS` classes (most), that is every label, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

MAX_LABELS = 32
OTHER = "other"


def labels_of(array: object) -> list | None:
    """Return one label per sample of an output (Python values), or None if it has no labels."""
    if not isinstance(array, np.ndarray):
        return None
    kind = array.dtype.kind
    if array.ndim == 2:
        if kind == "f":
            if array.shape[1] < 2:
                return None
            # NOTE: one sample (most requests): a flat arg-max is about half the cost of one along an axis.
            return [int(array.argmax())] if array.shape[0] == 1 else array.argmax(axis=1).tolist()
        if array.shape[1] == 1 and kind in "iubOSU":
            return array[:, 0].tolist()
        return None
    if array.ndim == 1 and kind in "iubOSU":
        return array.tolist()
    return None


def octave(value: float) -> str:
    """Name the power-of-two bucket holding `value`: '[0.25,0.5)', '(-2,-1]', '0', or 'nan'."""
    if value != value:
        return "nan"
    if value == 0:
        return "0"
    exponent = math.frexp(abs(value))[1]  # abs(value) in [2**(e-1), 2**e)
    low, high = f"{math.ldexp(1.0, exponent - 1):g}", f"{math.ldexp(1.0, exponent):g}"
    return f"[{low},{high})" if value > 0 else f"(-{high},-{low}]"


def value_buckets_of(array: object) -> list | None:
    """Return the octave of each sample's value for a float output with one value per sample, else None."""
    if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
        return None
    if array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1):
        return [octave(v) for v in array.reshape(-1).tolist()]
    return None


def _counted(array: object) -> list | None:
    labels = labels_of(array)
    return labels if labels is not None else value_buckets_of(array)


def predicted_labels(outputs: Mapping[str, np.ndarray]) -> list[tuple[str, list]]:
    """Return (output, labels of each sample) for every output that has labels; [] for none."""
    found = []
    for name, array in outputs.items():
        labels = _counted(array)
        if labels is not None:
            found.append((name, labels))
    return found


def label_name(value: object) -> str:
    """Return a label's name as the history and the metrics keep it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:64]
    return str(value)[:64]


def count_labels(outputs: Mapping[str, np.ndarray], into: dict[tuple[str, object], int]) -> None:
    """Add the predicted labels of one answer to `into` ((output, raw label) -> count).

    NOTE: per request, on the executor's thread: an arg-max and a dict update per sample, no
    np.unique and no string formatting (`add_bounded` names the labels once per batch).
    """
    for name, array in outputs.items():
        labels = _counted(array)
        if labels is None:
            continue
        for value in labels:
            key = (name, value)
            into[key] = into.get(key, 0) + 1


def add_bounded(
    totals: dict[str, dict[str, int]], batch: Mapping[tuple[str, object], int]
) -> dict[tuple[str, str], int]:
    """Add a batch's label counts into a version's totals, bounded; return them as counted (some as OTHER)."""
    counted: dict[tuple[str, str], int] = {}
    for (output, raw), count in batch.items():
        label = label_name(raw)
        labels = totals.setdefault(output, {})
        if label not in labels and len(labels) >= MAX_LABELS:
            label = OTHER
        labels[label] = labels.get(label, 0) + count
        counted[(output, label)] = counted.get((output, label), 0) + count
    return counted
