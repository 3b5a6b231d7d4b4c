"""What must hold inside a model archive: a well-formed manifest, and an ONNX model that loads and agrees with it.

`validate_manifest` (in `manifest.py`) checks the manifest's structure; `check_model` runs the ONNX checker, confines
external data to the archive, loads the model in ONNX Runtime on the CPU, compares the graph with
the declared signature and runs the golden samples. Each failure is an InvalidArchive naming why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnx

from controlplane.registry.errors import InvalidArchive
from controlplane.registry.manifest import MANIFEST_FILE, PLATFORM, file_problem, validate_manifest
from serving.golden import check_golden
from serving.runtime import check_spec_matches, declared_warmup, load_session, spec_from_session
from serving.settings import RuntimeSettings
from serving.tensors import ModelSpec

__all__ = ["MANIFEST_FILE", "MODEL_FILE", "PLATFORM", "check_model", "read_manifest", "validate_manifest"]

MODEL_FILE = "model.onnx"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024

# What a push or a build is doing, for a progress bar: (stage, done, total), e.g. ("checks", 2, 4);
# stages are "hashing" (bytes), "unpacking", "checks" (of CHECKS) and "golden" (samples run).
Progress = Callable[[str, int, int], None]
CHECKS = 4  # the ONNX checker, loading in ONNX Runtime, the signature, the declared warm-up


def no_progress(stage: str, done: int, total: int) -> None:
    """Report nothing (the default for callers without a progress bar)."""


def _reason(exc: Exception, folder: Path) -> str:
    # One line, without the server's temporary paths, and not a whole graph dump.
    text = " ".join(str(exc).replace(f"{folder}/", "").replace(str(folder), ".").split())
    return text if len(text) <= 500 else text[:500] + "..."


def read_manifest(folder: Path) -> dict[str, Any]:
    """Read and validate the manifest of an unpacked archive."""
    path = folder / MANIFEST_FILE
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise file_problem(f"is over {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise file_problem(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise file_problem("is nested too deeply") from None
    return validate_manifest(data)


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
