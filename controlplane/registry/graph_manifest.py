"""Derive a model's manifest from its ONNX graph, as `registry build` does: signature, batching, warm-up.

The graph says the signature and whether the model batches: when every input and output has a
dynamic axis 0 (and so rank 1 or more) it batches (the engine's default max batch size), else it
gets `max_batch_size: 0`, Triton's "no batch axis" (scalar inputs, stateful models whose state
carries the batch on another axis). The caller's hints add what a graph cannot say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from controlplane.registry.checks import PLATFORM
from serving.tensors import DATATYPES

_DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}


def graph_is_batchable(inputs: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]) -> bool:
    """Return whether every tensor has a dynamic first axis, so requests can be merged along it."""
    return all(t["shape"] and t["shape"][0] == -1 for t in [*inputs, *outputs])


def manifest_from_graph(
    model: onnx.ModelProto,
    *,
    name: str,
    version: str,
    sequence_inputs: Mapping[str, tuple[int, float]],
    max_batch_size: int | None = None,
    sequence_buckets: Sequence[int] = (),
    golden: list[dict] | None = None,
    description: str = "",
    metadata: Mapping[str, Any] | None = None,
    batching: Mapping[str, Any] | None = None,
    warmup: list[dict] | None = None,
) -> dict[str, Any]:
    """Derive a manifest from a graph's inputs and outputs plus the given hints; raise ValueError if impossible.

    `batching` holds the other per-model values (max_queue_delay_ms, max_queue_size,
    preferred_batch_sizes, default_timeout_ms, instances); `warmup` the manifest's warm-up samples.
    """
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializers]
    unknown = sorted(set(sequence_inputs) - {v.name for v in graph_inputs})
    if unknown:
        raise ValueError(f"sequence input(s) {unknown} are not graph inputs {[v.name for v in graph_inputs]}")

    def describe(value: onnx.ValueInfoProto) -> dict[str, Any]:
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
            raise ValueError(f"'{value.name}' is not a tensor with a declared shape")
        try:
            datatype = _DATATYPE_OF[np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"'{value.name}' has ONNX element type {tensor.elem_type}, not a supported one") from None
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim]
        entry: dict[str, Any] = {"name": value.name, "datatype": datatype, "shape": shape}
        if value.name in sequence_inputs:
            entry["sequence_axis"], entry["pad_value"] = sequence_inputs[value.name]
        return entry

    inputs = [describe(v) for v in graph_inputs]
    outputs = [describe(v) for v in model.graph.output]
    manifest: dict[str, Any] = {
        "name": name,
        "version": version,
        "platform": PLATFORM,
        "inputs": inputs,
        "outputs": outputs,
        "metadata": dict(metadata or {}),
    }
    options: dict[str, Any] = {}
    if max_batch_size is not None:
        options["max_batch_size"] = max_batch_size
    elif not graph_is_batchable(inputs, outputs):
        options["max_batch_size"] = 0
    if sequence_buckets:
        options["sequence_buckets"] = sorted(sequence_buckets)
    options.update({key: value for key, value in (batching or {}).items() if value not in (None, [], ())})
    if options:
        manifest["batching"] = options
    if description:
        manifest["description"] = description
    if golden:
        manifest["golden"] = golden
    if warmup:
        manifest["warmup"] = warmup
    return manifest
