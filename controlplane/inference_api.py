"""The Open Inference Protocol (KServe v2) over HTTP, with Triton's statistics extension.

Errors answer in the protocol's own form, {"error": "..."}, with the status the engine's error
carries; the management API uses its own envelope (controlplane.errors).
"""

from __future__ import annotations

import logging
import time

from flask import Blueprint, Response, g, json, request

from controlplane import __version__, metrics
from controlplane.auth.errors import REALM
from controlplane.auth.guard import bearer_actor
from controlplane.context import current_services
from controlplane.contract import operation
from controlplane.inference_schemas import (
    InferenceRequest,
    InferenceResponse,
    Live,
    ModelConfig,
    ModelMetadata,
    ModelReady,
    ModelStatistics,
    Ready,
    ServerMetadata,
)
from controlplane.requestlog import log_request
from serving.codec import HEADER_LENGTH, decode_request, encode_response, select_outputs
from serving.engine import Engine, LoadedVersion, Routed
from serving.errors import InputRejected, InvalidInput, ModelNotFound, Overloaded, PayloadTooLarge, ServingError
from serving.modelconfig import triton_config
from serving.runtime import CUDA
from serving.tensors import ModelSpec

log = logging.getLogger(__name__)

bp = Blueprint("oip", __name__, url_prefix="/v2")

SERVER_VERSION = __version__
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "model_repository"]


def _engine() -> Engine:
    return current_services().engine


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


OPEN_ENDPOINTS = {"oip.live", "oip.ready"}  # probes stay open even with FLIGHTDECK_INFERENCE_AUTH


@bp.before_request
def _require_token() -> Response | None:
    """With FLIGHTDECK_INFERENCE_AUTH, refuse /v2 requests without a valid API token (any role)."""
    if not current_services().settings.inference_auth or request.endpoint in OPEN_ENDPOINTS:
        return None
    if bearer_actor() is not None:
        return None
    response = _json({"error": "an API token is required: send 'Authorization: Bearer <token>'"}, 401)
    response.headers["WWW-Authenticate"] = REALM
    return response


@bp.errorhandler(ServingError)
def _serving_error(exc: ServingError) -> Response:
    response = _json({"error": exc.message}, exc.status)
    if isinstance(exc, Overloaded):
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


@bp.get("")
@operation(response=ServerMetadata, runtime=False)
def server_metadata() -> Response:
    """Server metadata: name, version, protocol extensions"""
    return _json({"name": "flightdeck", "version": SERVER_VERSION, "extensions": EXTENSIONS})


@bp.get("/health/live")
@operation(response=Live, runtime=False)
def live() -> Response:
    """Liveness: the process answers"""
    return _json({"live": True})


@bp.get("/health/ready")
@operation(response=Ready, runtime=False, errors={503: "Not ready (loading, or draining)"})
def ready() -> Response:
    """Readiness: every deployed model this node serves is loaded and checked, and the node is not draining"""
    is_ready = _engine().ready()
    return _json({"ready": is_ready}, 200 if is_ready else 503)


def _versions(name: str) -> list[LoadedVersion]:
    loaded = _engine().loaded(name)
    if not loaded:
        raise ModelNotFound(f"unknown model '{name}'; loaded: {_engine().models()}")
    return loaded


def _loaded(name: str, version: str | None) -> LoadedVersion:
    loaded = _versions(name)
    if version is None:
        return _engine().resolve(name) if _engine().model_ready(name) else loaded[0]
    for v in loaded:
        if v.spec.version == version:
            return v
    raise ModelNotFound(f"model '{name}' has no version {version} loaded")


def _spec(name: str, version: str | None) -> ModelSpec:
    return _loaded(name, version).spec


@bp.get("/models/<name>")
@bp.get("/models/<name>/versions/<version>")
@operation(response=ModelMetadata, runtime=False, errors={404: "No such model or version loaded"})
def model_metadata(name: str, version: str | None = None) -> Response:
    """A model's metadata: versions, platform, input and output tensors"""
    spec = _spec(name, version)
    return _json(
        {
            "name": name,
            "versions": sorted({v.spec.version for v in _versions(name)}),
            "platform": spec.platform,
            "inputs": [t.to_metadata() for t in spec.inputs],
            "outputs": [t.to_metadata() for t in spec.outputs],
        }
    )


@bp.get("/models/<name>/config")
@bp.get("/models/<name>/versions/<version>/config")
@operation(response=ModelConfig, runtime=False, errors={404: "No such model or version loaded"})
def model_config(name: str, version: str | None = None) -> Response:
    """A loaded version's effective configuration, in Triton's model configuration form"""
    loaded = _loaded(name, version)
    return _json(triton_config(loaded.spec, loaded.config, on_gpu=loaded.provider == CUDA))


@bp.get("/models/<name>/ready")
@bp.get("/models/<name>/versions/<version>/ready")
@operation(response=ModelReady, runtime=False, errors={404: "No such model or version loaded", 503: "Not ready"})
def model_ready(name: str, version: str | None = None) -> Response:
    """Whether a model (or one version) is loaded and ready"""
    _spec(name, version)  # 404 for unknown model or version
    is_ready = _engine().model_ready(name, version)
    return _json({"name": name, "ready": is_ready}, 200 if is_ready else 503)


def _header_length() -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer, not {raw!r}")
    return int(raw)


def _read_body(limit: int) -> bytes:
    request.max_content_length = limit  # NOTE: above the app-wide limit for management bodies
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"request body of {request.content_length} bytes is over the limit of {limit}")
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
    return body


@bp.post("/models/<name>/infer")
@bp.post("/models/<name>/versions/<version>/infer")
@operation(
    body=InferenceRequest, response=InferenceResponse, runtime=False,
    errors={
        404: "No such model or version loaded", 413: "The body is larger than FLIGHTDECK_MAX_REQUEST_BYTES",
        429: "The queue is full (Retry-After)", 500: "The model failed on this request",
        503: "Not ready, or draining", 504: "The request's deadline passed before it ran",
    },
)  # fmt: skip
def infer(name: str, version: str | None = None) -> Response:
    """Run an inference: JSON tensors, or JSON then binary tensors (the binary tensor extension)"""
    services = current_services()  # NOTE: once: each lookup through Flask's app proxy costs about a microsecond
    settings, engine = services.settings, services.engine
    started = time.perf_counter()
    record: dict = {"request_id": g.request_id, "model": name, "version": version}
    status = 500
    tensors = None
    try:
        engine.check_admission(name)  # before decoding: refusing the excess must be cheap
        body = _read_body(settings.max_request_bytes)
        decode_started = time.perf_counter_ns()
        decoded = decode_request(body, _header_length())
        decode_ns = time.perf_counter_ns() - decode_started
        timeout_us = decoded.timeout_us
        decode_ms = (time.perf_counter() - started) * 1000
        tensors = decoded.tensors
        routed = engine.infer(
            name,
            decoded.tensors,
            version=version,
            timeout_s=None if timeout_us is None else timeout_us / 1e6,
            route_key=request.headers.get("X-Route-Key"),
            outputs=None if decoded.outputs is None else [o.name for o in decoded.outputs],
        )
        record.update(version=routed.version, slot=routed.slot, batch_size=routed.batch_size)
        record.update(
            decode_ms=round(decode_ms, 3),
            queue_ms=round(routed.queue_s * 1000, 3),
            compute_ms=round(routed.compute_s * 1000, 3),
        )
        encode_started = time.perf_counter_ns()
        wanted = select_outputs(decoded, list(routed.outputs))
        body, json_length = encode_response(name, routed.version, decoded.id, routed.outputs, wanted)
        _record_codec(engine, name, routed, decode_ns, time.perf_counter_ns() - encode_started)
        response = Response(
            body, status=200, mimetype="application/json" if json_length is None else "application/octet-stream"
        )
        if json_length is not None:
            response.headers[HEADER_LENGTH] = str(json_length)
        response.headers["X-Model-Version"] = routed.version
        response.headers["X-Model-Slot"] = routed.slot
        status = 200
        return response
    except ServingError as exc:
        status = exc.status
        record["error"] = exc.message
        if exc.version is not None:  # routed before it failed: the line names the version and slot
            record.update(version=exc.version, slot=exc.slot)
        # InputRejected ran in a slot, whose observer already counted it as a client error.
        if isinstance(exc, (InvalidInput, ModelNotFound, PayloadTooLarge)) and not isinstance(exc, InputRejected):
            # Unknown names share one label, so made-up model names cannot grow the series.
            metrics.record_invalid(name if name in engine.models() else "_unknown")
        raise
    finally:
        log_request(
            record,
            status=status,
            total_ms=(time.perf_counter() - started) * 1000,
            sample_rate=settings.log_sample_rate,
            slow_ms=settings.slow_request_ms,
            tensors=tensors,
        )


def _record_codec(engine: Engine, name: str, routed: Routed, decode_ns: int, encode_ns: int) -> None:
    """Count a successful request's decode and encode time in the statistics of the version that ran it."""
    for loaded in engine.loaded(name):
        if loaded.slot == routed.slot and loaded.spec.version == routed.version:
            loaded.batcher.record_codec(decode_ns, encode_ns)
            return
    # NOTE: a version unloaded while this request was encoded has no statistics left to count in.


def _stats_entry(loaded: LoadedVersion) -> dict:
    s = loaded.batcher.stats  # NOTE: a copy taken under the batcher's lock, consistent with itself

    def pair(count: int, ns: int) -> dict:
        return {"count": count, "ns": ns}

    return {
        "name": loaded.spec.name,
        "version": loaded.spec.version,
        "slot": loaded.slot,
        "provider": loaded.provider,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": pair(s.success, s.success_ns),
            "fail": pair(s.failed, s.failed_ns),
            "queue": pair(s.success + s.failed, s.queue_ns),
            # Decode of the request's inputs and encode of its outputs, per successful request.
            "compute_input": pair(s.decoded, s.decode_ns),
            "compute_infer": pair(s.execution_count, s.compute_ns),
            "compute_output": pair(s.encoded, s.encode_ns),
            "cache_hit": pair(0, 0),
            "cache_miss": pair(0, 0),
        },
        "batch_stats": [
            # Codec time is measured per request, not per batch, so batch entries carry compute_infer only.
            {"batch_size": size, "compute_infer": pair(count, ns)}
            for size, (count, ns) in sorted(s.batch_sizes.items())
        ],
        "timeouts": s.timeouts,
        "rejected": s.rejected,
        # Of "fail": requests the model refused for their own input (400s); and the extra runs bisection took.
        "client_errors": s.client_errors,
        "bisect_runs": s.bisect_runs,
        "queue_depth": loaded.batcher.queue_depth,
        "padding": {"real_tokens": s.real_tokens, "padded_tokens": s.padded_tokens},
    }


@bp.get("/models/stats")
@bp.get("/models/<name>/stats")
@bp.get("/models/<name>/versions/<version>/stats")
@operation(response=ModelStatistics, runtime=False, errors={404: "No such model or version loaded"})
def stats(name: str | None = None, version: str | None = None) -> Response:
    """Triton's statistics extension: counts and durations per loaded version, and batch sizes"""
    loaded = _engine().loaded() if name is None else _versions(name)
    if version is not None:
        loaded = [v for v in loaded if v.spec.version == version]
        if not loaded:
            raise ModelNotFound(f"model '{name}' has no version {version} loaded")
    return _json({"model_stats": [_stats_entry(v) for v in sorted(loaded, key=lambda v: (v.spec.name, v.slot))]})
