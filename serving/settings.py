"""Engine settings: plain typed values, filled in by the control plane's config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeSettings:
    """ONNX Runtime knobs applied to every session the engine creates."""

    # "auto" uses CUDA when a GPU is usable, "cpu" never does, "cuda" insists (and reports a fallback).
    device: str = "auto"
    gpu_device_id: int = 0
    # 0 lets ONNX Runtime pick (one per physical core).
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    # Spinning threads burn the cores the HTTP threads need between batches.
    allow_spinning: bool = False
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
    max_queue_size: int = 256
    default_timeout_ms: float = 10_000.0
    # Executor threads per loaded version; one is right for a CPU with few cores.
    instances: int = 1
    # Longest sequence bucket used for warm-up shapes.
    warmup_max_sequence: int = 128
