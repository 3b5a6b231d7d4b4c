"""Predicted labels of a model's answers, counted per version so a canary's answers can be compared.

A classifier-like output (floating point, one row of scores per sample: shape [batch, classes])
counts the arg-max of its last axis; an integer or BYTES output with one value per sample (shape
[batch] or [batch, 1]) counts that value. Other outputs (embeddings, sequences, images) are not
counted. Cardinality is bounded: per output, the first `MAX_LABELS` distinct labels a version
answers are kept by name and every later one counts as `OTHER`. For a classifier of up to
`MAX_LABELS` classes (most), that is every label, exactly.
"""

from __future__ import annotations

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
            return array.argmax(axis=1).tolist() if array.shape[1] >= 2 else None
        if array.shape[1] == 1 and kind in "iubOSU":
            return array[:, 0].tolist()
        return None
    if array.ndim == 1 and kind in "iubOSU":
        return array.tolist()
    return None


def predicted_labels(outputs: Mapping[str, np.ndarray]) -> list[tuple[str, list]]:
    """Return (output, labels of each sample) for every output that has labels; [] for none."""
    found = []
    for name, array in outputs.items():
        labels = labels_of(array)
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
        labels = labels_of(array)
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
