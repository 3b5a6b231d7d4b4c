"""Engine settings: plain typed values, filled in by the control plane's config."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeSettings:
    """ONNX Runtime knobs applied to every session the engine creates."""

    # "auto" uses CUDA when a GPU is usable, "cpu" never does, "cuda" insists (and reports a fallback).
    device: str = "auto"
    gpu_device_id: int = 0
    # 0 means auto: on the CPU, the cores shared out among the batch instances (see parallelism()).
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    # Spinning threads burn the cores the event loop and the other executors need between batches.
    allow_spinning: bool = False
    # Stop the intra-op threads' spinning when the last run in flight returns (ORT's session.force_spinning_stop):
    # spinning then speeds up a run's many small parallel sections without burning the cores between runs.
    force_spinning_stop: bool = False
    # On the CPU, when each instance's session has fewer intra-op threads than there are cores: a second
    # session with every core (spinning within a run only) for a request that runs with nothing else running
    # or queued on the node (serving.cores), kept where it runs the heaviest batch-1 warm-up sample faster
    # (timed at load). Costs a second copy of the weights. Off here, as learn_batch_limits, so in-process
    # engines do not time this machine; the control plane decides its own default.
    lone_request_session: bool = False
    graph_optimization: str = "all"  # disable | basic | extended | all
    enable_cpu_mem_arena: bool = True
    enable_mem_pattern: bool = True
    arena_extend_strategy: str = "kNextPowerOfTwo"  # or kSameAsRequested
    # 0 means no limit; otherwise the CUDA provider's gpu_mem_limit in bytes.
    gpu_mem_limit_bytes: int = 0


@dataclass(frozen=True)
class BatchingSettings:
    """Dynamic batching, admission and deadline knobs, per loaded model version."""

    enabled: bool = True
    # Upper bound; a model's own max_batch_size hint can only lower it.
    max_batch_size: int = 32
    max_queue_delay_ms: float = 2.0
    # Samples (not requests) waiting per loaded version before new ones are refused.
    max_queue_size: int = 128
    default_timeout_ms: float = 10_000.0
    # Executor threads per loaded version, each running its own batch; 0 means auto (parallelism()).
    instances: int = 0
    # Longest sequence bucket used for warm-up shapes.
    warmup_max_sequence: int = 128
    # One successful request in this many has its numeric inputs summarised for drift (serving.inputstats); 0: none.
    input_sample_every: int = 16
    # Time batch sizes 1, 2, 4, ... at load and merge requests only up to the smallest size whose cost per
    # sample is within `batch_cost_margin` of the best (serving.batchcost), within `batch_cost_budget_s`.
    # Off here so in-process engines batch by the limits alone; the control plane turns it on by default.
    learn_batch_limits: bool = False
    batch_cost_margin: float = 0.05
    batch_cost_budget_s: float = 3.0


def parallelism(runtime: RuntimeSettings, batching: BatchingSettings, on_gpu: bool) -> tuple[int, int]:
    """Return (executor instances, intra-op threads) with the 0 = auto settings resolved.

    On the CPU several single-threaded executors beat one multi-threaded one under load: measured
    on 2 cores with the HTTP threads beside them, 1 thread x 2 instances served 632 samples/s
    where 2 threads x 1 instance served 527, because Python threads preempting one of ORT's
    intra-op threads stall its partner. The cost was batch-1 latency on an idle server: a lone
    request used one core. `lone_request_session` gives such a request a session with every core
    (serving.engine, where timing at load says it is faster). On a GPU, two instances overlap one
    batch's host work with the other's kernels.
    """
    cores = os.cpu_count() or 1
    if on_gpu:
        return batching.instances or 2, runtime.intra_op_threads
    instances = batching.instances or min(cores, 4)
    return instances, runtime.intra_op_threads or max(1, cores // instances)
