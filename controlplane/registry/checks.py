"""What must hold inside a model archive: a well-formed manifest, and an ONNX model that loads and agrees with it.

`validate_manifest` checks the manifest's structure; `check_model` runs the ONNX checker, confines
external data to the archive, loads the model in ONNX Runtime on the CPU, compares the graph with
the declared signature and runs the golden samples. Each failure is an InvalidArchive naming why.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnx

from controlplane.registry.errors import InvalidArchive
from serving.golden import check_golden, decode_tensor
from serving.runtime import WARMUP_FILLS, check_spec_matches, declared_warmup, load_session, spec_from_session
from serving.settings import RuntimeSettings
from serving.tensors import DATATYPES, ModelSpec

MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PLATFORM = "onnxruntime_onnx"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_GOLDEN_SAMPLES = 32
MAX_DIM = 2**31 - 1

_KEYS = {"name", "version", "platform", "inputs", "outputs", "batching", "golden", "warmup", "metadata", "description"}
_REQUIRED = ("name", "version", "inputs", "outputs")
_TENSOR_KEYS = {"name", "datatype", "shape", "sequence_axis", "pad_value"}
_SAMPLE_KEYS = {"inputs", "outputs", "atol", "rtol"}
_BATCHING_KEYS = {
    "max_batch_size",
    "sequence_buckets",
    "preferred_batch_sizes",
    "max_queue_delay_ms",
    "max_queue_size",
    "default_timeout_ms",
    "instances",
}
# What a push or a build is doing, for a progress bar: (stage, done, total), e.g. ("checks", 2, 4);
# stages are "hashing" (bytes), "unpacking", "checks" (of CHECKS) and "golden" (samples run).
Progress = Callable[[str, int, int], None]
CHECKS = 4  # the ONNX checker, loading in ONNX Runtime, the signature, the declared warm-up


def no_progress(stage: str, done: int, total: int) -> None:
    """Report nothing (the default for callers without a progress bar)."""


MAX_WARMUP_SAMPLES = 8
MAX_WARMUP_COUNT = 16
MAX_WARMUP_VALUES = 2**24  # per tensor: a warm-up input is built in memory at every load


def _fail(message: str) -> InvalidArchive:
    return InvalidArchive(f"manifest.json: {message}")


def _reason(exc: Exception, folder: Path) -> str:
    # One line, without the server's temporary paths, and not a whole graph dump.
    text = " ".join(str(exc).replace(f"{folder}/", "").replace(str(folder), ".").split())
    return text if len(text) <= 500 else text[:500] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_manifest(folder: Path) -> dict[str, Any]:
    """Read and validate the manifest of an unpacked archive."""
    path = folder / MANIFEST_FILE
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise _fail(f"is over {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise _fail("is nested too deeply") from None
    return validate_manifest(data)


def validate_manifest(data: Any) -> dict[str, Any]:
    """Check a manifest's structure and return it; raise InvalidArchive naming the first problem."""
    if not isinstance(data, dict):
        raise _fail("must be a JSON object")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise _fail(f"is missing required key(s) {missing}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise _fail(f"has unknown key(s) {unknown}; allowed: {sorted(_KEYS)} (free-form data goes in 'metadata')")
    for key, pattern in (("name", NAME_RE), ("version", VERSION_RE)):
        if not isinstance(data[key], str) or not pattern.match(data[key]):
            raise _fail(f"{key} {data[key]!r} must be a string matching {pattern.pattern}")
    if data.get("platform", PLATFORM) != PLATFORM:
        raise _fail(f"platform must be {PLATFORM!r}, not {data['platform']!r}")
    if not isinstance(data.get("metadata", {}), dict):
        raise _fail("metadata must be a JSON object")
    if not isinstance(data.get("description", ""), str):
        raise _fail("description must be a string")
    max_batch, buckets = _check_batching(data.get("batching", {}))
    inputs = _check_tensors(data["inputs"], "input", max_batch)
    outputs = _check_tensors(data["outputs"], "output", max_batch)
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            # NOTE: with max_batch_size 0 (Triton's "no batch axis") a shape is the model's own, whole.
            if max_batch and (not t["shape"] or (t["shape"][0] != -1 and not (t["shape"][0] == 1 and max_batch == 1))):
                raise _fail(
                    f"{kind} '{t['name']}' must have a dynamic batch axis (-1 at axis 0), or 1 with "
                    f"batching.max_batch_size 1; got shape {t['shape']} (a model without a batch axis, "
                    "or with scalars, declares batching.max_batch_size 0)"
                )
    if buckets and not any("sequence_axis" in t for t in inputs):
        raise _fail("batching.sequence_buckets is set but no input has a sequence_axis")
    _check_golden(data.get("golden", []), inputs, outputs, max_batch)
    _check_warmup(data.get("warmup", []), inputs, max_batch)
    return data


def _increasing(values: Any) -> bool:
    return (
        isinstance(values, list)
        and all(_is_int(b) and b >= 1 for b in values)
        and all(a < b for a, b in zip(values, values[1:]))
    )


def _check_batching(batching: Any) -> tuple[int, list[int]]:
    if not isinstance(batching, dict) or set(batching) - _BATCHING_KEYS:
        raise _fail(f"batching must be an object with some of {sorted(_BATCHING_KEYS)}")
    max_batch = batching.get("max_batch_size", 32)
    if not _is_int(max_batch) or not 0 <= max_batch <= 65536:
        raise _fail(f"batching.max_batch_size must be an integer from 0 (no batch axis) to 65536, not {max_batch!r}")
    buckets = batching.get("sequence_buckets", [])
    if not _increasing(buckets):
        raise _fail(f"batching.sequence_buckets must be increasing positive integers, not {buckets!r}")
    preferred = batching.get("preferred_batch_sizes", [])
    if not _increasing(preferred) or any(b > max_batch for b in preferred):
        raise _fail(
            f"batching.preferred_batch_sizes must be increasing integers from 1 to max_batch_size {max_batch}, "
            f"not {preferred!r}"
        )
    limits = (
        ("max_queue_delay_ms", 0, 60_000, _is_number),
        ("default_timeout_ms", 1, 3_600_000, _is_number),
        ("max_queue_size", 1, 1_000_000, _is_int),
        ("instances", 1, 64, _is_int),
    )
    for key, low, high, kind in limits:
        value = batching.get(key)
        if value is not None and (not kind(value) or not low <= value <= high):
            what = "an integer" if kind is _is_int else "a number"
            raise _fail(f"batching.{key} must be {what} from {low} to {high}, not {value!r}")
    return max_batch, buckets


def _check_tensors(entries: Any, kind: str, max_batch: int) -> list[dict[str, Any]]:
    if not isinstance(entries, list) or not entries:
        raise _fail(f"{kind}s must be a non-empty list")
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) - _TENSOR_KEYS or not {"name", "datatype", "shape"} <= set(entry):
            raise _fail(
                f"each of {kind}s must be an object with name, datatype, shape (and optionally "
                f"sequence_axis, pad_value); got {entry!r:.200}"
            )
        name = entry["name"]
        if not isinstance(name, str) or not name or len(name) > 256:
            raise _fail(f"{kind} name {name!r:.100} must be a non-empty string")
        if name in seen:
            raise _fail(f"{kind} '{name}' is declared twice")
        seen.add(name)
        if not isinstance(entry["datatype"], str) or entry["datatype"] not in DATATYPES:
            raise _fail(f"{kind} '{name}' has datatype {entry['datatype']!r}; known: {sorted(DATATYPES)}")
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(_is_int(d) and (d == -1 or 1 <= d <= MAX_DIM) for d in shape):
            raise _fail(
                f"{kind} '{name}' shape must be a list of positive integers, -1 for a dynamic axis, [] for a "
                f"scalar; got {shape!r}"
            )
        _check_sequence(entry, kind, 1 if max_batch else 0)
    return entries


def _check_sequence(entry: dict[str, Any], kind: str, first: int) -> None:
    name, shape = entry["name"], entry["shape"]
    axis = entry.get("sequence_axis")
    if axis is None:
        if "pad_value" in entry:
            raise _fail(f"{kind} '{name}' has a pad_value but no sequence_axis")
        return
    if entry["datatype"] == "BYTES":
        raise _fail(f"{kind} '{name}' is BYTES and cannot have a sequence_axis (strings are not padded)")
    if not _is_int(axis) or not first <= axis < len(shape):
        raise _fail(f"{kind} '{name}' sequence_axis must be an axis from {first} to {len(shape) - 1}, not {axis!r}")
    if shape[axis] != -1:
        raise _fail(f"{kind} '{name}' sequence_axis {axis} must be a dynamic axis (-1), not {shape[axis]}")
    if kind == "output":
        if "pad_value" in entry:
            raise _fail(f"output '{name}' may not have a pad_value (outputs are trimmed, not padded)")
        return
    pad = entry.get("pad_value", 0)
    dtype = DATATYPES[entry["datatype"]]
    if not _is_number(pad) and not (dtype.kind == "b" and isinstance(pad, bool)):
        raise _fail(f"input '{name}' pad_value must be a number, not {pad!r}")
    if dtype.kind in "iu" and (not float(pad).is_integer() or not np.iinfo(dtype).min <= pad <= np.iinfo(dtype).max):
        raise _fail(f"input '{name}' pad_value {pad!r} is not a valid {entry['datatype']} value")
    if dtype.kind == "b" and pad not in (0, 1):
        raise _fail(f"input '{name}' pad_value {pad!r} is not a valid BOOL value")


def _check_golden(samples: Any, inputs: list[dict], outputs: list[dict], max_batch: int) -> None:
    if not isinstance(samples, list) or len(samples) > MAX_GOLDEN_SAMPLES:
        raise _fail(f"golden must be a list of at most {MAX_GOLDEN_SAMPLES} samples")
    declared_in = {t["name"]: t for t in inputs}
    declared_out = {t["name"]: t for t in outputs}
    for index, sample in enumerate(samples):
        where = f"golden sample {index}"
        if not isinstance(sample, dict) or set(sample) - _SAMPLE_KEYS or not {"inputs", "outputs"} <= set(sample):
            raise _fail(f"{where} must be an object with inputs, outputs (and optionally atol, rtol)")
        for key in ("atol", "rtol"):
            if key in sample and (not _is_number(sample[key]) or sample[key] < 0):
                raise _fail(f"{where} {key} must be a non-negative number, not {sample[key]!r}")
        given_in, given_out = sample["inputs"], sample["outputs"]
        if not isinstance(given_in, dict) or set(given_in) != set(declared_in):
            got = sorted(given_in) if isinstance(given_in, dict) else given_in
            raise _fail(f"{where} inputs must be exactly {sorted(declared_in)}, got {got!r:.200}")
        if not isinstance(given_out, dict) or not given_out or set(given_out) - set(declared_out):
            got = sorted(given_out) if isinstance(given_out, dict) else given_out
            raise _fail(f"{where} outputs must name some of {sorted(declared_out)}, got {got!r:.200}")
        for kind, given, declared in (("input", given_in, declared_in), ("output", given_out, declared_out)):
            for name, entry in given.items():
                _check_golden_tensor(f"{where} {kind} '{name}'", entry, declared[name], max_batch)


def _check_golden_tensor(where: str, entry: Any, declared: dict[str, Any], max_batch: int) -> None:
    if not isinstance(entry, dict) or set(entry) != {"datatype", "shape", "data"}:
        raise _fail(f"{where} must be an object with datatype, shape and data")
    try:
        array = decode_tensor(entry)
    except ValueError as exc:
        raise _fail(f"{where}: {exc}") from None
    if entry["datatype"] != declared["datatype"]:
        raise _fail(f"{where} is {entry['datatype']} but declared {declared['datatype']}")
    shape = declared["shape"]
    if array.ndim != len(shape) or any(d >= 0 and a != d for a, d in zip(array.shape, shape)):
        raise _fail(f"{where} has shape {list(array.shape)}, declared {shape}")
    if max_batch and not 1 <= array.shape[0] <= max_batch:
        raise _fail(f"{where} has batch {array.shape[0]}; it must be from 1 to batching.max_batch_size {max_batch}")


def _check_warmup(samples: Any, inputs: list[dict], max_batch: int) -> None:
    """Warm-up samples: {"inputs": {name: {"shape": [...], "fill": "zeros|ones|random"}}, "count": n}."""
    if not isinstance(samples, list) or len(samples) > MAX_WARMUP_SAMPLES:
        raise _fail(f"warmup must be a list of at most {MAX_WARMUP_SAMPLES} samples")
    declared = {t["name"]: t for t in inputs}
    for index, sample in enumerate(samples):
        where = f"warmup sample {index}"
        if (
            not isinstance(sample, dict)
            or set(sample) - {"inputs", "count"}
            or not isinstance(sample.get("inputs"), dict)
        ):
            raise _fail(f"{where} must be an object with inputs (and optionally count)")
        count = sample.get("count", 1)
        if not _is_int(count) or not 1 <= count <= MAX_WARMUP_COUNT:
            raise _fail(f"{where} count must be an integer from 1 to {MAX_WARMUP_COUNT}, not {count!r}")
        if set(sample["inputs"]) != set(declared):
            raise _fail(f"{where} inputs must be exactly {sorted(declared)}, got {sorted(sample['inputs'])!r:.200}")
        for name, entry in sample["inputs"].items():
            _check_warmup_tensor(f"{where} input '{name}'", entry, declared[name]["shape"], max_batch)


def _check_warmup_tensor(where: str, entry: Any, shape: list[int], max_batch: int) -> None:
    if not isinstance(entry, dict) or set(entry) - {"shape", "fill"} or "shape" not in entry:
        raise _fail(f"{where} must be an object with shape (and optionally fill)")
    if entry.get("fill", "zeros") not in WARMUP_FILLS:
        raise _fail(f"{where} fill must be one of {list(WARMUP_FILLS)}, not {entry['fill']!r}")
    dims = entry["shape"]
    if not isinstance(dims, list) or not all(_is_int(d) and d >= 1 for d in dims):
        raise _fail(f"{where} shape must be a list of positive integers, not {dims!r:.100}")
    if len(dims) != len(shape) or any(d >= 0 and a != d for a, d in zip(dims, shape)):
        raise _fail(f"{where} has shape {dims}, declared {shape}")
    if max_batch and dims[0] > max_batch:
        raise _fail(f"{where} has batch {dims[0]}, over batching.max_batch_size {max_batch}")
    if math.prod(dims) > MAX_WARMUP_VALUES:
        raise _fail(f"{where} has {math.prod(dims)} values, over the limit of {MAX_WARMUP_VALUES}")


def external_data_locations(model: onnx.ModelProto) -> Iterator[tuple[str, str]]:
    """Yield (tensor name, location) for every tensor of the model stored as external data."""

    def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            yield from node_tensors(node)

    def node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from graph_tensors(sub)

    tensors = [*graph_tensors(model.graph)]
    for function in model.functions:
        for node in function.node:
            tensors.extend(node_tensors(node))
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            yield tensor.name, entries.get("location", "")


def _check_location(folder: Path, tensor: str, location: str) -> None:
    path = PurePosixPath(location)
    if not location or "\\" in location or path.is_absolute() or re.match(r"^[A-Za-z]:", location):
        raise InvalidArchive(f"model.onnx: tensor '{tensor}' names external data {location!r}, not a relative path")
    if ".." in path.parts:
        raise InvalidArchive(f"model.onnx: tensor '{tensor}' names external data {location!r} outside the archive")
    target = folder / location
    if not target.is_file() or target.is_symlink() or not target.resolve().is_relative_to(folder.resolve()):
        raise InvalidArchive(f"model.onnx: tensor '{tensor}' names external data {location!r}, which the archive lacks")


def check_model(folder: Path, manifest: dict[str, Any], progress: Progress = no_progress) -> bool | None:
    """Check the model in an unpacked archive against its manifest; return whether golden samples ran and passed.

    Returns None when the manifest has no golden samples; any failure raises InvalidArchive. `progress`
    hears of each check passed and each golden sample run.
    """
    path = folder / MODEL_FILE
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InvalidArchive(f"model.onnx is not an ONNX model: {_reason(exc, folder)}") from None
    for tensor, location in external_data_locations(model):
        _check_location(folder, tensor, location)
    del model
    try:
        onnx.checker.check_model(str(path))  # by path, so external data is checked too
    except Exception as exc:  # onnx raises ValidationError, or protobuf errors for garbage
        raise InvalidArchive(f"model.onnx fails the ONNX checker: {_reason(exc, folder)}") from None
    progress("checks", 1, CHECKS)
    try:
        session = load_session(path, RuntimeSettings(device="cpu"))
    except Exception as exc:  # ONNX Runtime raises its own exception types
        raise InvalidArchive(f"ONNX Runtime cannot load model.onnx: {_reason(exc, folder)}") from None
    progress("checks", 2, CHECKS)
    spec = ModelSpec.from_manifest(manifest)
    try:
        check_spec_matches(spec, session.session)
    except ValueError as exc:
        raise InvalidArchive(f"manifest.json does not match the graph: {exc}") from None
    graph = {t.name: t for t in spec_from_session(session.session, spec.name, spec.version).inputs}
    for t in spec.inputs:
        for axis, (declared, actual) in enumerate(zip(t.shape, graph[t.name].shape)):
            if declared == -1 and actual >= 0:
                raise InvalidArchive(
                    f"manifest.json does not match the graph: input '{t.name}' axis {axis} is declared dynamic "
                    f"but the graph fixes it to {actual}"
                )
    progress("checks", 3, CHECKS)
    try:
        for sample in declared_warmup(spec):
            session.run(sample)
    except Exception as exc:  # ONNX Runtime raises its own exception types
        raise InvalidArchive(f"a declared warm-up sample fails to run: {_reason(exc, folder)}") from None
    progress("checks", CHECKS, CHECKS)
    if not manifest.get("golden"):
        return None
    total, ran = len(manifest["golden"]), [0]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return session.run(inputs)
        finally:
            ran[0] += 1
            progress("golden", ran[0], total)

    failures = check_golden(manifest, run)
    if failures:
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        raise InvalidArchive(f"golden samples do not match the model: {'; '.join(failures[:3])}{more}")
    return True
