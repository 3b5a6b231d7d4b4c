"""Cheap summaries of a version's numeric inputs, so a drift in what callers send can be seen.

A *feature* of an input tensor is one number per sample: for an input whose sample is a row of at
most `MAX_COLUMNS` values (a tabular model's [batch, 4]), each column is a feature (`x[0]`, `x[1]`,
... or `x` alone for one value); for a larger sample (an image, a sequence of tokens, Magika's 2048
bytes) the features are the mean and the standard deviation of the sample's values (`pixels`,
`pixels.std`; over at most `MEAN_OF` of them, evenly strided): a crude, model-agnostic view that moves
when the inputs move (another file type or a dimmer camera moves the mean, noise the spread). At most `MAX_FEATURES`
features per version, in the order of the model's inputs; BYTES and bool inputs are not summarised.

Per feature: count, sum and sum of squares (mean and variance, mergeable by adding) and a histogram
over fixed log-spaced bins (`BINS_PER_OCTAVE` per power of two, signed, a bin for zero) that every
version, window and process shares, so histograms merge by adding counts and two windows compare
bin by bin. At most `MAX_BINS` bins are kept per feature per version; later ones count as `OTHER`.

Sampling: the batcher summarises one successful request in `every` (BatchingSettings.
input_sample_every), outside its lock; `bench/input_cost.py` measures what that costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

MAX_FEATURES = 8
MAX_COLUMNS = 8
MEAN_OF = 1024  # a wide sample's mean and spread are taken over at most this many of its values, evenly strided
MAX_BINS = 96
BINS_PER_OCTAVE = 4
OTHER = "other"
_add = np.add.reduce
_TINY = 2.0**-40  # below this a value is zero for the histogram (float noise around 0)


def features_of(tensors: Mapping[str, np.ndarray], samples: int) -> list[tuple[str, list[float]]]:
    """Return (feature, one value per sample) for the numeric inputs of one request, bounded."""
    found: list[tuple[str, list[float]]] = []
    for name, array in tensors.items():
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "iuf" or array.size == 0:
            continue
        if array.size % max(1, samples):  # no batch axis of `samples` (a scalar beside batched inputs): skipped
            continue
        rows = array.reshape(max(1, samples), -1)
        width = rows.shape[1]
        if width == 1:
            found.append((name, rows[:, 0].tolist()))
        elif width <= MAX_COLUMNS:
            found.extend((f"{name}[{i}]", column) for i, column in enumerate(rows.T.tolist()))
        else:
            # NOTE: a sample's mean from at most MEAN_OF values, evenly strided (an image's 150,528 values
            # cost ~100 us to add up; 1024 of them ~3 us), in float64: int32 or float16 sums overflow.
            # np.add.reduce, not .mean()/.std(): the same sums without their Python-level wrappers (~4x faster).
            step = -(-width // MEAN_OF)
            taken = (rows[:, ::step] if step > 1 else rows).astype(np.float64)
            count = taken.shape[1]
            if taken.shape[0] == 1:  # NOTE: most requests: Python floats and one dot product beat 5 array ops
                flat = taken[0]
                mean = float(_add(flat)) / count
                found.append((name, [mean]))
                found.append((f"{name}.std", [math.sqrt(max(0.0, float(flat @ flat) / count - mean * mean))]))
            else:
                means = _add(taken, axis=1) / count
                spread = np.sqrt(np.maximum(_add(taken * taken, axis=1) / count - means * means, 0.0))
                found.append((name, means.tolist()))
                found.append((f"{name}.std", spread.tolist()))
        if len(found) >= MAX_FEATURES:
            break
    return found[:MAX_FEATURES]


def bin_of(value: float) -> str:
    """Name the fixed bin holding `value`: 'p<k>' / 'n<k>' (k = floor(log2|v| * BINS_PER_OCTAVE)), '0' or 'nan'."""
    if value != value:
        return "nan"
    magnitude = abs(value)
    if magnitude < _TINY:
        return "0"
    if math.isinf(magnitude):
        return "pinf" if value > 0 else "ninf"
    k = math.floor(math.log2(magnitude) * BINS_PER_OCTAVE)
    return f"p{k}" if value > 0 else f"n{k}"


def bin_range(name: str) -> tuple[float, float] | None:
    """Return the [low, high) values of a bin named by `bin_of` (None for '0', 'nan', infinities, OTHER)."""
    if len(name) < 2 or name[0] not in "pn" or not name[1:].lstrip("-").isdigit():
        return None
    k = int(name[1:])
    low, high = 2.0 ** (k / BINS_PER_OCTAVE), 2.0 ** ((k + 1) / BINS_PER_OCTAVE)
    return (low, high) if name[0] == "p" else (-high, -low)


def empty() -> dict:
    """A feature's summary with nothing counted: {'n', 'sum', 'sumsq', 'bins'}."""
    return {"n": 0, "sum": 0.0, "sumsq": 0.0, "bins": {}}


def add_values(summaries: dict[str, dict], features: list[tuple[str, list[float]]]) -> None:
    """Add sampled feature values into a version's cumulative summaries (feature -> summary), bounded."""
    for feature, values in features:
        summary = summaries.get(feature)
        if summary is None:
            if len(summaries) >= MAX_FEATURES:
                continue
            summary = summaries[feature] = empty()
        bins = summary["bins"]
        for value in values:
            if value == value and not math.isinf(value):  # NaN and infinities go to their bins only
                summary["n"] += 1
                summary["sum"] += value
                summary["sumsq"] += value * value
            name = bin_of(value)
            if name not in bins and len(bins) >= MAX_BINS:
                name = OTHER
            bins[name] = bins.get(name, 0) + 1


def copy(summaries: Mapping[str, dict]) -> dict[str, dict]:
    """Return an independent copy of feature summaries."""
    return {f: {**s, "bins": dict(s["bins"])} for f, s in summaries.items()}


def since(before: Mapping[str, dict], after: Mapping[str, dict]) -> dict[str, dict]:
    """Return what was added between two snapshots of the same cumulative summaries (features with samples)."""
    found = {}
    for feature, now in after.items():
        then = before.get(feature) or empty()
        bins = {b: c - then["bins"].get(b, 0) for b, c in now["bins"].items() if c - then["bins"].get(b, 0)}
        if bins:
            found[feature] = {
                "n": now["n"] - then["n"],
                "sum": now["sum"] - then["sum"],
                "sumsq": now["sumsq"] - then["sumsq"],
                "bins": bins,
            }
    return found


def merge(into: dict[str, dict], other: Mapping[str, dict]) -> None:
    """Add `other`'s summaries into `into` (rows of any process, interval or rollup)."""
    for feature, summary in other.items():
        mine = into.setdefault(feature, empty())
        mine["n"] += summary.get("n", 0)
        mine["sum"] += summary.get("sum", 0.0)
        mine["sumsq"] += summary.get("sumsq", 0.0)
        for b, c in summary.get("bins", {}).items():
            mine["bins"][b] = mine["bins"].get(b, 0) + c


def moments(summary: Mapping) -> tuple[float, float] | None:
    """Return (mean, variance) of a summary's finite values; None without any."""
    n = summary.get("n", 0)
    if not n:
        return None
    mean = summary["sum"] / n
    return mean, max(0.0, summary["sumsq"] / n - mean * mean)
