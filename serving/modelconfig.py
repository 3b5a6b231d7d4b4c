"""A loaded model's effective serving configuration: its manifest's values over the engine-wide ones.

How they combine (the runbook's `set_batching` changes the engine-wide values at run time):

- max batch size: the smaller of the engine's and the model's; the engine's is a cap (a runbook
  can shrink every batch at once), the model's is what its graph takes. A model with
  `max_batch_size: 0` has no batch axis: every request runs alone, whatever the engine says.
- queue delay, queue size, default timeout, instances: the model's own where its manifest sets
  them, else the engine's (so `set_batching` moves only the models that did not choose).
- preferred batch sizes: the model's, those over the effective max batch size dropped.
- with batching switched off engine-wide, nothing is merged and nobody waits for a batch.
- batch limits: where warm-up measured the version's cost curve (serving.batchcost), per sequence
  bucket the batch size past which cost per sample stopped falling, under the max batch size, and
  never under the model's largest preferred batch size (what its author asked for is not bounded away
  by a timing); requests are merged up to it. Recomputed from the same curve when the engine-wide max
  changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from serving.batchcost import CostCurve
from serving.settings import BatchingSettings
from serving.tensors import ModelSpec


@dataclass(frozen=True)
class ModelConfig:
    """The values one loaded version's batcher and deadlines run with."""

    combine: bool  # whether requests may be merged into one run
    max_batch_size: int  # the batcher's limit in samples; 1 for a model without a batch axis
    max_queue_delay_ms: float
    max_queue_size: int
    preferred_batch_sizes: tuple[int, ...]
    default_timeout_ms: float
    instances: int
    # Per sequence bucket (0: no sequence axis), the largest batch requests are merged into; empty: max_batch_size.
    batch_limits: dict[int, int] = field(default_factory=dict)
    cost_curve: CostCurve | None = None  # what warm-up measured, when it did
    # The lone-request session's intra-op threads (0: none) and the timing at load that decided it, in ms:
    # {"shared": the heaviest lone warm-up sample on the shared session, "alone": on the lone one, and where known
    # "others_cores": the cores other processes kept busy meanwhile (serving.nodeload)}; None: not timed.
    lone_request_threads: int = 0
    lone_request_ms: dict[str, float] | None = None

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_ms / 1000

    @property
    def default_timeout_s(self) -> float:
        return self.default_timeout_ms / 1000


def effective_config(
    spec: ModelSpec, engine: BatchingSettings, instances: int, cost_curve: CostCurve | None = None
) -> ModelConfig:
    """Combine a model's own configuration with the engine-wide settings (see the module docstring)."""
    combine = engine.enabled and spec.batched
    max_batch = min(engine.max_batch_size, spec.max_batch_size) if spec.batched else 1
    preferred = tuple(b for b in spec.preferred_batch_sizes if b <= max_batch) if combine else ()
    limits = cost_curve.limits_under(max_batch) if cost_curve is not None and combine else {}
    if preferred:
        # NOTE: a size the model's own configuration asks for is not bounded away by a timing at load: on a flat
        # curve the learned limit is the small end (textcls seq 128: 2, where 4 served x1.06-1.17; docs/benchmarks.md).
        limits = {bucket: max(limit, preferred[-1]) for bucket, limit in limits.items()}
    delay = engine.max_queue_delay_ms if spec.max_queue_delay_ms is None else spec.max_queue_delay_ms
    return ModelConfig(
        combine=combine,
        max_batch_size=max_batch,
        max_queue_delay_ms=delay if combine else 0.0,
        max_queue_size=engine.max_queue_size if spec.max_queue_size is None else spec.max_queue_size,
        preferred_batch_sizes=preferred,
        default_timeout_ms=engine.default_timeout_ms if spec.default_timeout_ms is None else spec.default_timeout_ms,
        instances=instances,
        batch_limits=limits,
        cost_curve=cost_curve,
    )


def triton_config(spec: ModelSpec, config: ModelConfig, on_gpu: bool) -> dict[str, Any]:
    """Render the effective configuration in the shape of Triton's model configuration (JSON)."""
    result: dict[str, Any] = {
        "name": spec.name,
        "platform": spec.platform,
        "backend": "onnxruntime",
        # Triton's 0 means "no batch axis"; a batched model shows the limit it really runs with.
        "max_batch_size": config.max_batch_size if spec.batched else 0,
        "input": [t.to_config(spec.batched) for t in spec.inputs],
        "output": [t.to_config(spec.batched) for t in spec.outputs],
        "instance_group": [{"count": config.instances, "kind": "KIND_GPU" if on_gpu else "KIND_CPU"}],
        "dynamic_batching": {
            "preferred_batch_size": list(config.preferred_batch_sizes),
            "max_queue_delay_microseconds": int(config.max_queue_delay_ms * 1000),
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": int(config.default_timeout_ms * 1000),
                "allow_timeout_override": True,
                "max_queue_size": config.max_queue_size,
            },
        },
    }
    parameters: dict[str, dict[str, str]] = {}
    if spec.sequence_buckets:
        parameters["sequence_buckets"] = {"string_value": ",".join(map(str, spec.sequence_buckets))}
    if config.cost_curve is not None:
        # Triton's parameters are strings: "bucket:limit" pairs, and the measured curve as JSON
        # ({bucket: {batch size: ms per sample}}; bucket 0 for a model without a sequence axis).
        parameters["batch_limits"] = {
            "string_value": ",".join(f"{bucket}:{limit}" for bucket, limit in sorted(config.batch_limits.items()))
        }
        parameters["batch_cost_ms_per_sample"] = {"string_value": json.dumps(config.cost_curve.describe())}
    if config.lone_request_ms is not None:
        # A request that runs with nothing else running or queued runs on a session with this many threads (0: none).
        parameters["lone_request_threads"] = {"string_value": str(config.lone_request_threads)}
        parameters["lone_request_ms"] = {"string_value": json.dumps(config.lone_request_ms)}
    if parameters:
        result["parameters"] = parameters
    if spec.warmup:
        types = {t.name: t.to_config(spec.batched)["data_type"] for t in spec.inputs}
        result["model_warmup"] = [
            {
                "name": f"sample_{index}",
                "count": int(sample.get("count", 1)),
                "inputs": {
                    name: {
                        "data_type": types[name],
                        "dims": list(entry["shape"]),
                        # Triton knows zero_data and random_data; "ones" is ours.
                        _FILL_KEYS[entry.get("fill", "zeros")]: True,
                    }
                    for name, entry in sample["inputs"].items()
                },
            }
            for index, sample in enumerate(spec.warmup)
        ]
    return result


_FILL_KEYS = {"zeros": "zero_data", "random": "random_data", "ones": "ones_data"}
