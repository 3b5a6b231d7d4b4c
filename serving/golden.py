"""Golden samples: known inputs with expected outputs, carried in a model's manifest.

A manifest's "golden" list holds samples shaped like

    {"inputs": {"x": {"datatype": "FP32", "shape": [1, 4], "data": [0.5, 1.0, -2.0, 0.25]}},
     "outputs": {"y": {"datatype": "FP32", "shape": [1, 4], "data": [...]}},
     "atol": 1e-4, "rtol": 1e-3}

with `data` flat in row-major order (strings for BYTES; `"shape": []` for a scalar). The registry checks them on the CPU before it stores a
version; the rollout reconciler checks them again once a version is loaded into a slot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from serving.tensors import DATATYPES

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def decode_tensor(entry: Mapping[str, Any]) -> np.ndarray:
    """Turn a {"datatype", "shape", "data"} entry into an array; raise ValueError when it is malformed."""
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise ValueError(f"datatype {datatype!r} is not one of {sorted(DATATYPES)}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"shape must be a list of non-negative integers, not {shape!r}")
    data = entry.get("data")
    dtype = DATATYPES[datatype]
    if dtype.kind == "O":
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise ValueError("data must be a flat list of strings for BYTES")
        if len(data) != math.prod(shape):
            raise ValueError(f"data holds {len(data)} values, shape {shape} needs {math.prod(shape)}")
        strings = np.empty(len(data), dtype=object)
        strings[:] = data
        return strings.reshape(shape)
    # NOTE: numpy would turn None into NaN and truncate 1.5 to an integer 1; refuse both instead.
    allowed = (bool, int, float) if dtype.kind in "fc" else (bool, int)
    if not isinstance(data, list) or not all(type(v) in allowed for v in data):
        kind = "numbers" if dtype.kind in "fc" else "integers"
        raise ValueError(f"data must be a flat list of {kind} for {datatype}")
    try:
        array = np.asarray(data, dtype=dtype)
    except OverflowError as exc:
        raise ValueError(f"data does not fit {datatype}: {exc}") from None
    if array.ndim != 1 or array.size != math.prod(shape):
        raise ValueError(f"data holds {array.size} values (rank {array.ndim}), shape {shape} needs {math.prod(shape)}")
    return array.reshape(shape)


def encode_tensor(array: np.ndarray) -> dict[str, Any]:
    """Turn an array into a {"datatype", "shape", "data"} entry (the inverse of decode_tensor)."""
    names = {dtype: name for name, dtype in DATATYPES.items()}
    if array.dtype not in names:
        raise ValueError(f"unsupported numpy dtype {array.dtype}")
    data = [str(v) for v in array.reshape(-1)] if array.dtype.kind == "O" else array.reshape(-1).tolist()
    return {"datatype": names[array.dtype], "shape": list(array.shape), "data": data}


def _samples(manifest_or_samples: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    if isinstance(manifest_or_samples, Mapping):
        return manifest_or_samples.get("golden") or []
    return manifest_or_samples


def check_golden(manifest_or_samples: Mapping[str, Any] | Sequence[Mapping[str, Any]], run: RunFn) -> list[str]:
    """Run every golden sample through `run` and return what failed (empty when all pass).

    Takes a manifest (its "golden" list is read; a `ModelSpec` does not keep it, so pass the
    manifest, e.g. `serving.engine.read_manifest(loaded.path)`) or the list of samples itself.
    `run` maps input names to arrays and returns output arrays by name, e.g. `Session.run`.

        failures = check_golden(read_manifest(loaded.path), loaded.session.run)
    """
    failures: list[str] = []
    for index, sample in enumerate(_samples(manifest_or_samples)):
        where = f"golden sample {index}"
        try:
            inputs = {name: decode_tensor(entry) for name, entry in sample["inputs"].items()}
            expected = {name: decode_tensor(entry) for name, entry in sample["outputs"].items()}
            atol = float(sample.get("atol", DEFAULT_ATOL))
            rtol = float(sample.get("rtol", DEFAULT_RTOL))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            failures.append(f"{where} is malformed: {exc}")
            continue
        try:
            got = run(inputs)
        except Exception as exc:  # ONNX Runtime raises its own exception types
            failures.append(f"{where} failed to run: {exc}")
            continue
        for name, want in expected.items():
            failure = _compare(name, want, got.get(name), atol, rtol)
            if failure:
                failures.append(f"{where}: {failure}")
    return failures


def _compare(name: str, want: np.ndarray, got: np.ndarray | None, atol: float, rtol: float) -> str | None:
    if got is None:
        return f"output '{name}' is missing from the model's outputs"
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"output '{name}' has shape {list(got.shape)}, expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"output '{name}' has dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind in "fc":
        close = np.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    else:
        close = got == want
    if close.all():
        return None
    if want.dtype.kind == "O":
        worst = int(np.argmin(close.reshape(-1)))
        return (
            f"output '{name}' differs at {int((~close).sum())} of {close.size} values (e.g. index {worst}: "
            f"got {got.reshape(-1)[worst]!r:.60}, expected {want.reshape(-1)[worst]!r:.60})"
        )
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    worst = int(np.argmax(np.where(close, -np.inf, diff)))
    return (
        f"output '{name}' differs at {int((~close).sum())} of {close.size} values "
        f"(max abs diff {float(np.nanmax(diff)):.3g}, e.g. index {worst}: got {got.reshape(-1)[worst].item()!r}, "
        f"expected {want.reshape(-1)[worst].item()!r}; atol {atol:g}, rtol {rtol:g})"
    )
