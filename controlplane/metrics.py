"""Prometheus metrics, declared once. Names follow Triton's counterparts where one exists.

Under gunicorn with several workers, PROMETHEUS_MULTIPROC_DIR is set before this module is
imported (gunicorn.conf.py), so every value lives in a shared mmap file and /metrics aggregates
them with the multiprocess collector; every gauge declares how to merge across processes.
With several nodes, `render` adds a `node` label (FLIGHTDECK_NODE, the host name by default) to
every sample, so series from different nodes never collide and dashboards can group by node.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector

from controlplane import exemplars
from controlplane.metricsflush import Buffer, Count, flush_all, mark_due
from serving.batching import RequestOutcome
from serving.errors import ModelNotFound
from serving.telemetry import sample_gpus

if TYPE_CHECKING:
    from serving.engine import Engine

_SLOT = ("model", "version", "slot")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = Counter(
    "flightdeck_inference_requests_total",
    "Inference requests by outcome: success, error (the model or engine failed), client_error (the model refused "
    "the request's own input, before or while it ran), timeout, rejected, invalid (for a model not served: no slot "
    "to count it in) (nv_inference_request_success/failure).",
    (*_SLOT, "outcome"),
)
CLIENT_ERRORS = Counter(
    "flightdeck_inference_client_errors_total",
    "Inference requests refused for their own input (the client_error outcome), by kind: malformed, shape, "
    "datatype, unknown_input, unknown_output, batch_size, too_large, not_found (a version not loaded), runtime "
    "(ONNX Runtime refused the values).",
    (*_SLOT, "reason"),
)
INFERENCES = Counter(
    "flightdeck_inference_count_total", "Samples inferred, a batch of n counting n (nv_inference_count).", _SLOT
)
EXECUTIONS = Counter("flightdeck_inference_exec_count_total", "Batches executed (nv_inference_exec_count).", _SLOT)
QUEUE_SECONDS = Histogram(
    "flightdeck_inference_queue_seconds", "Time requests waited in the queue.", _SLOT, buckets=_LATENCY_BUCKETS
)
COMPUTE_SECONDS = Histogram(
    "flightdeck_inference_compute_seconds",
    "Model run time of the batch a request rode in.",
    _SLOT,
    buckets=_LATENCY_BUCKETS,
)
REQUEST_SECONDS = Histogram(
    "flightdeck_inference_request_seconds",
    "Engine time per request, queue plus compute.",
    _SLOT,
    buckets=_LATENCY_BUCKETS,
)
LONE_RUNS = Counter(
    "flightdeck_inference_lone_runs_total",
    "Of the batches executed, those that ran on the version's lone-request session with every core "
    "(FLIGHTDECK_ORT_LONE_REQUEST_SESSION: a request that came with nothing else running on the node); the rest ran "
    "on the shared session.",
    _SLOT,
)
BATCH_SIZE = Histogram(
    "flightdeck_inference_batch_size", "Samples per executed batch.", _SLOT, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
TOKENS = Counter(
    "flightdeck_sequence_tokens_total",
    "Sequence positions run, kind=real or padded (padded minus real is the padding waste).",
    (*_SLOT, "kind"),
)
PREDICTIONS = Counter(
    "flightdeck_prediction_label_total",
    "Samples answered per predicted label: the arg-max of a classifier's scores, a label output's value, or the "
    "power-of-two bucket of a one-value output (per output, the first 32 labels a version answers, then 'other').",
    ("model", "version", "output", "label"),
)
DRIFT_SCORE = Gauge(
    "flightdeck_drift_score",
    "Jensen-Shannon divergence (bits, 0..1) of a version's predicted labels (kind=predictions, name=output) or a "
    "sampled input feature (kind=input) over the last FLIGHTDECK_DRIFT_WINDOW_S against its reference window; "
    "set by the scheduler leader.",
    ("model", "version", "kind", "name"),
    multiprocess_mode="livemostrecent",
)
QUEUE_DEPTH = Gauge(
    "flightdeck_queue_depth",
    "Samples waiting (nv_inference_pending_request_count).",
    _SLOT,
    multiprocess_mode="livesum",
)
MODEL_INFO = Gauge(
    "flightdeck_model_info",
    "1 for each loaded model version, with the provider it runs on.",
    (*_SLOT, "provider"),
    multiprocess_mode="livemax",
)
TRAFFIC_WEIGHT = Gauge(
    "flightdeck_traffic_weight",
    "Traffic weight of a model's slot (0-100).",
    ("model", "slot"),
    multiprocess_mode="livemax",
)
LEADER = Gauge(
    "flightdeck_leader",
    "1 on the node one of whose processes holds the scheduler lease (runs the cluster jobs), else 0.",
    multiprocess_mode="livemax",
)
JOB_PROCESS_RSS = Gauge(
    "flightdeck_job_process_resident_bytes",
    "Resident memory of the lease holder's job process (the window jobs) after its last job.",
    multiprocess_mode="livemax",
)
JOB_PROCESS_STARTS = Counter(
    "flightdeck_job_process_starts_total",
    "Job processes started, by why: first, retired (grew past FLIGHTDECK_JOB_PROCESS_MAX_GROWTH_MB), "
    "exited (died during a job), timeout (killed after FLIGHTDECK_JOB_PROCESS_TIMEOUT_S), "
    "lease (this worker leads again after it lost the lease, which stopped the last).",
    ("why",),
)
ENGINE_READY = Gauge(
    "flightdeck_engine_ready",
    "1 when every serving process is ready (the minimum over processes).",
    multiprocess_mode="livemin",
)
GPU_UTILIZATION = Gauge(
    "flightdeck_gpu_utilization_ratio",
    "GPU utilisation 0-1 (nv_gpu_utilization).",
    ("gpu",),
    multiprocess_mode="mostrecent",
)
GPU_MEMORY_USED = Gauge(
    "flightdeck_gpu_memory_used_bytes",
    "GPU memory used (nv_gpu_memory_used_bytes).",
    ("gpu",),
    multiprocess_mode="mostrecent",
)
GPU_MEMORY_TOTAL = Gauge(
    "flightdeck_gpu_memory_total_bytes",
    "GPU memory total (nv_gpu_memory_total_bytes).",
    ("gpu",),
    multiprocess_mode="mostrecent",
)
NOTIFICATION_ATTEMPTS = Counter(
    "flightdeck_notification_attempts_total",
    "Alert notification delivery attempts by outcome: delivered, retry (failed, will be tried again), failed "
    "(given up). Every attempt counts, so a message tried 8 times before it went through counts 7 retries.",
    ("receiver", "kind", "outcome"),
)
NOTIFICATIONS = Counter(
    "flightdeck_notifications_total",
    "Alert notification messages by how they ended: sent, failed (given up), superseded (a newer message for "
    "the same receiver and group replaced it before it went out), withdrawn (its alerts were all silenced or "
    "inhibited before it went out).",
    ("receiver", "outcome"),
)
CONNECTIONS_CLOSED = Counter(
    "flightdeck_connections_closed_total",
    "Client connections the server closed, by reason: header_timeout (the request head did not arrive whole in "
    "HEADER_TIMEOUT_S, or nothing came), body_timeout (the body stopped arriving: BODY_TIMEOUT_S, BODY_MIN_RATE), "
    "send_timeout (the client did not read its answer for SEND_TIMEOUT_S), keepalive_timeout (idle between requests), "
    "evicted (idle, closed to make room past worker_connections), rebalanced (answered with Connection: close so "
    "that the client reconnects to a worker holding fewer connections).",
    ("reason",),
)
LOOP_LAG = Histogram(
    "flightdeck_event_loop_lag_seconds",
    "How late each worker's event loop ran a timer due every 0.1 s while an HTTP client is connected or the engine "
    "holds a request (every second otherwise): time the loop spent on something else.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
LOOP_LAG_MAX = Gauge(
    "flightdeck_event_loop_lag_max_seconds",
    "The longest event-loop lag of the last second, the worst worker's.",
    multiprocess_mode="livemax",
)


def connection_closed(reason: str) -> None:
    """Count a connection the server closed (reason: one of controlplane.httpprotocol.REASONS)."""
    CONNECTIONS_CLOSED.labels(reason).inc()


class LoopLag:
    """Records event-loop lag samples: each in the histogram, the worst of each second in the gauge."""

    WINDOW_S = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._worst = 0.0
        self._since = clock()

    def record(self, lag_s: float) -> None:
        LOOP_LAG.observe(lag_s)
        self._worst = max(self._worst, lag_s)
        now = self._clock()
        # NOTE: by time, not by count: the samples come every 0.1 s under load and every second when idle.
        if now - self._since >= self.WINDOW_S:
            LOOP_LAG_MAX.set(self._worst)
            self._worst, self._since = 0.0, now


class SlotMetrics:
    """The engine's observer for one loaded version: counted in memory, written by `metricsflush` (<= 0.5 s)."""

    def __init__(self, model: str, version: str, slot: str) -> None:
        labels = (model, version, slot)
        self._model, self._version = model, version
        self._predicted: dict[tuple[str, str], Any] = {}  # (output, label) -> cell, bounded by the batcher
        buffer = self._buffer = Buffer(self)
        self._lock = buffer.lock
        self._labels = labels
        self._outcomes = {o: buffer.count(REQUESTS.labels(*labels, o.value)) for o in RequestOutcome}
        self._kinds: dict[str, Count] = {}  # client-error kind -> its cell, made at the first one
        self._queue = buffer.observations(QUEUE_SECONDS.labels(*labels))
        self._compute = buffer.observations(COMPUTE_SECONDS.labels(*labels))
        self._total = buffer.observations(REQUEST_SECONDS.labels(*labels))
        self._batch = buffer.observations(BATCH_SIZE.labels(*labels))
        self._inferences = buffer.count(INFERENCES.labels(*labels))
        self._executions = buffer.count(EXECUTIONS.labels(*labels))
        self._lone = buffer.count(LONE_RUNS.labels(*labels))
        self._real = buffer.count(TOKENS.labels(*labels, "real"))
        self._padded = buffer.count(TOKENS.labels(*labels, "padded"))
        # NOTE: written through, not buffered: a queue's peak lasts less than a flush interval, and the
        # gauge is what operators (and the drain test) watch for backpressure; one write per change.
        self._depth = QUEUE_DEPTH.labels(*labels)

    def request_done(self, outcome: RequestOutcome, queue_s: float, compute_s: float, total_s: float) -> None:
        # A client error that ran: the runtime refused its values.
        kind = self._kind("runtime") if outcome is RequestOutcome.CLIENT_ERROR else None
        with self._lock:
            self._outcomes[outcome].n += 1
            if kind is not None:
                kind.n += 1
            if outcome in _RAN:
                self._queue.observe(queue_s)
                self._compute.observe(compute_s)
                self._total.observe(total_s)
        mark_due()

    def request_refused(self, kind: str) -> None:
        count = self._kind(kind)
        with self._lock:
            self._outcomes[RequestOutcome.CLIENT_ERROR].n += 1
            count.n += 1
        mark_due()

    def _kind(self, kind: str) -> Count:
        """The cell of one client-error kind, made at its first use (outside the buffer's lock, which making takes)."""
        count = self._kinds.get(kind)
        if count is None:
            count = self._kinds[kind] = self._buffer.count(CLIENT_ERRORS.labels(*self._labels, kind))
        return count

    def batch_done(self, size: int, real_tokens: int, padded_tokens: int, compute_s: float) -> None:
        with self._lock:
            self._batch.observe(size)
            self._executions.n += 1
            self._inferences.n += size
            if padded_tokens:
                self._real.n += real_tokens
                self._padded.n += padded_tokens
        mark_due()

    def lone_ran(self) -> None:
        """Count a run on the lone-request session (called after `batch_done` of the same run)."""
        with self._lock:
            self._lone.n += 1
        mark_due()

    def labels_done(self, counted: dict[tuple[str, str], int]) -> None:
        """Count one batch's predicted labels (already bounded: serving.predictions)."""
        for key in counted:
            if key not in self._predicted:  # NOTE: a new cell takes the buffer's lock itself
                self._predicted[key] = self._buffer.count(PREDICTIONS.labels(self._model, self._version, *key))
        with self._lock:
            for key, n in counted.items():
                self._predicted[key].n += n
        mark_due()

    def queue_changed(self, depth: int) -> None:
        self._depth.set(depth)


_RAN = frozenset((RequestOutcome.SUCCESS, RequestOutcome.ERROR, RequestOutcome.CLIENT_ERROR))


def record_invalid(model: str) -> None:
    """Count a request refused for a model no slot serves (nothing to count it in as a client error)."""
    REQUESTS.labels(model, "", "", "invalid").inc()


def update_gpu_gauges() -> None:
    """Refresh GPU gauges from NVML; without a GPU there is nothing to set."""
    for gpu in sample_gpus():
        GPU_UTILIZATION.labels(str(gpu.index)).set(gpu.utilization)
        GPU_MEMORY_USED.labels(str(gpu.index)).set(gpu.memory_used_bytes)
        GPU_MEMORY_TOTAL.labels(str(gpu.index)).set(gpu.memory_total_bytes)


class _SettledFilesCollector:
    """The multiprocess collector, minus files a starting worker has created but not yet sized.

    NOTE: a scrape racing a worker's start-up otherwise reads a zero-byte file and fails (struct.error).
    """

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self):
        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if os.path.getsize(f) > 0]
        return multiprocess.MultiProcessCollector.merge(files, accumulate=True)


class _NodeLabelled:
    """Another collector's metrics with `node="<name>"` added to every sample."""

    def __init__(self, source: Collector, node: str) -> None:
        self._source = source
        self._node = node

    def collect(self):
        for family in self._source.collect():
            # NOTE: a copy, never the source's own samples: the default registry hands out live objects.
            samples = [s._replace(labels={**s.labels, "node": self._node}) for s in family.samples]
            family = Metric(family.name, family.documentation, family.type, family.unit)
            family.samples = samples
            yield family


def render(node: str, openmetrics: bool = False) -> bytes:
    """Render every metric with a `node` label, aggregated over worker processes when running under gunicorn.

    `openmetrics`: in the OpenMetrics format, with exemplars (trace ids) on the request latency histogram.
    """
    flush_all()  # this process's counts are current; other workers' are at most metricsflush.FLUSH_INTERVAL_S late
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    source: Collector = _SettledFilesCollector(path) if path else DEFAULT_REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    if not openmetrics:
        registry.register(_NodeLabelled(source, node))
        return generate_latest(registry)
    registry.register(_WithExemplars(_NodeLabelled(source, node)))
    return openmetrics_latest(registry)


class _WithExemplars:
    """Another collector's metrics, the request latency buckets with this process's exemplars (`exemplars`)."""

    def __init__(self, source: Collector) -> None:
        self._source = source

    def collect(self):
        return exemplars.attach(self._source.collect())


class ServingGauges:
    """Publish what this process serves (model info, traffic weights); what it stopped serving drops to 0.

    NOTE: both gauges are `livemax` over processes, so a process must lower a label it no longer
    serves (a replaced version, an undeployed model) or the old value would stand for ever.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._info: set[tuple[str, str, str, str]] = set()
        self._weights: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def publish(self) -> None:
        """Set the gauges from the engine now (after a reconcile pass and before each scrape)."""
        with self._lock:
            info = {(v.spec.name, v.spec.version, v.slot, v.provider) for v in self._engine.loaded()}
            weights: dict[tuple[str, str], int] = {}
            for name in self._engine.models():
                try:
                    weights.update({(name, slot): w for slot, w in self._engine.weights(name).items()})
                except ModelNotFound:  # unloaded since models() answered
                    continue
            for labels in self._info - info:
                MODEL_INFO.labels(*labels).set(0)
            for labels in info:
                MODEL_INFO.labels(*labels).set(1)
            for key in self._weights - weights.keys():
                TRAFFIC_WEIGHT.labels(*key).set(0)
            for key, weight in weights.items():
                TRAFFIC_WEIGHT.labels(*key).set(weight)
            self._info, self._weights = info, set(weights)
