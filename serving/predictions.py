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


def predicted_labels(outputs: Mapping[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Return (output, labels of each sample) for every output that has labels; [] for none."""
    found = []
    for name, array in outputs.items():
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            continue
        kind = array.dtype.kind
        if kind == "f" and array.ndim == 2 and array.shape[1] >= 2:
            found.append((name, array.argmax(axis=1)))
        elif kind in "iuSUOb" and (array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)):
            found.append((name, array.reshape(-1)))
    return found


def label_name(value: object) -> str:
    """Return a label's name as the history and the metrics keep it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:64]
    if isinstance(value, np.generic):
        value = value.item()
    return str(value)[:64]


def count_labels(outputs: Mapping[str, np.ndarray], into: dict[tuple[str, str], int]) -> None:
    """Add the predicted labels of one answer to `into` ((output, label) -> count)."""
    for name, labels in predicted_labels(outputs):
        if labels.size == 1:
            key = (name, label_name(labels[0]))
            into[key] = into.get(key, 0) + 1
            continue
        values, counts = np.unique(labels, return_counts=True)
        for value, count in zip(values, counts, strict=True):
            key = (name, label_name(value))
            into[key] = into.get(key, 0) + int(count)


def add_bounded(totals: dict[str, dict[str, int]], batch: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Add a batch's label counts into a version's totals, bounded; return them as counted (some as OTHER)."""
    counted: dict[tuple[str, str], int] = {}
    for (output, label), count in batch.items():
        labels = totals.setdefault(output, {})
        if label not in labels and len(labels) >= MAX_LABELS:
            label = OTHER
        labels[label] = labels.get(label, 0) + count
        counted[(output, label)] = counted.get((output, label), 0) + count
    return counted
