"""What a batcher tells the world: request outcomes, the observer hook, cumulative statistics."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Protocol

from serving import inputstats
from serving.histogram import Histogram


class RequestOutcome(enum.StrEnum):
    """How a request that reached a batcher ended."""

    SUCCESS = "success"
    ERROR = "error"  # the model or the engine failed: a server error
    CLIENT_ERROR = "client_error"  # the runtime refused the request's own input: a 400
    TIMEOUT = "timeout"
    REJECTED = "rejected"


class BatchObserver(Protocol):
    """Receives timings as they happen; the control plane turns them into metrics."""

    def request_done(self, outcome: RequestOutcome, queue_s: float, compute_s: float, total_s: float) -> None: ...

    def request_refused(self, kind: str) -> None:
        """A request refused for its own input before it ran (a client error of `kind`, serving.errors)."""
        ...

    def batch_done(self, size: int, real_tokens: int, padded_tokens: int, compute_s: float) -> None: ...

    def queue_changed(self, depth: int) -> None: ...


class BatchTracer(Protocol):
    """Told of each batch that ran with at least one traced request; the control plane makes it a span.

    `traces` are the opaque values callers attached to their requests (`Engine.submit(..., trace=...)`),
    in batch order; `outcomes` has one entry per request of the batch, traced or not. Called in the
    thread that ran the batch, after every request of it was answered; it must not raise.
    """

    def batch_ran(
        self, traces: list[object], size: int, compute_s: float, outcomes: list[RequestOutcome], extra_runs: int
    ) -> None: ...


@dataclass
class BatcherStats:
    """Cumulative counters in the shape of Triton's statistics extension (nanoseconds).

    NOTE: the batcher's executor threads write these under its lock; `Batcher.stats` hands readers
    a copy taken under the same lock, so every field of one copy describes the same moment.
    """

    success: int = 0
    success_ns: int = 0
    failed: int = 0  # every failure that ran, client errors included (Triton's "fail")
    failed_ns: int = 0
    client_errors: int = 0  # ... of which the request's own input was the cause (refused before it ran, too)
    client_error_kinds: dict[str, int] = field(default_factory=dict)  # ... by kind (serving.errors.CLIENT_ERROR_KINDS)
    bisect_runs: int = 0  # extra model runs spent splitting failed batches
    lone_runs: int = 0  # of execution_count, the runs on the lone-request session (every core)
    timeouts: int = 0
    rejected: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    last_inference_ms: int = 0
    # Protocol codec time of successful requests, measured by the transport (Triton's compute_input/output).
    decoded: int = 0
    decode_ns: int = 0
    encoded: int = 0
    encode_ns: int = 0
    # batch size -> [executions, compute nanoseconds]
    batch_sizes: dict[int, list[int]] = field(default_factory=dict)
    # Engine latency (queue + compute) of every request that ran, mergeable across intervals.
    latency: Histogram = field(default_factory=Histogram)
    # Compute time of each batch, per batch size: the canary judge compares versions at matching sizes.
    compute: dict[int, Histogram] = field(default_factory=dict)
    # Predicted labels of successful answers: output -> label -> samples (serving.predictions, bounded).
    labels: dict[str, dict[str, int]] = field(default_factory=dict)
    # Sampled numeric inputs: feature -> {n, sum, sumsq, bins} (serving.inputstats, bounded).
    inputs: dict[str, dict] = field(default_factory=dict)

    def copy(self) -> BatcherStats:
        """Return an independent copy (the caller holds the lock that guards this one)."""
        return replace(
            self,
            batch_sizes={size: list(pair) for size, pair in self.batch_sizes.items()},
            latency=self.latency.copy(),
            client_error_kinds=dict(self.client_error_kinds),
            compute={size: h.copy() for size, h in self.compute.items()},
            labels={output: dict(counts) for output, counts in self.labels.items()},
            inputs=inputstats.copy(self.inputs),
        )


@dataclass(frozen=True)
class BatcherSnapshot:
    """Cumulative counters at one moment, plus the queue's max and mean since the previous snapshot."""

    taken_at: float
    success: int
    failed: int
    client_errors: int
    bisect_runs: int
    timeouts: int
    rejected: int
    execution_count: int
    real_tokens: int
    padded_tokens: int
    batch_counts: dict[int, int]
    latency: Histogram
    latency_sum_s: float
    queue_depth_max: int
    queue_depth_mean: float
    client_error_kinds: dict[str, int] = field(default_factory=dict)
    compute: dict[int, Histogram] = field(default_factory=dict)
    labels: dict[str, dict[str, int]] = field(default_factory=dict)
    inputs: dict[str, dict] = field(default_factory=dict)
