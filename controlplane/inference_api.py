"""The Open Inference Protocol (KServe v2) over HTTP, with Triton's statistics extension.

Errors answer in the protocol's own form, {"error": "..."}, with the status the engine's error
carries; the management API uses its own envelope (controlplane.errors).
"""

from __future__ import annotations

import logging

from flask import Blueprint, Response, g, json, request

from controlplane import __version__
from controlplane.auth.errors import REALM
from controlplane.auth.guard import bearer_actor
from controlplane.context import current_services
from controlplane.contract import operation
from controlplane.inference import Answer, error_answer, read_body, serve
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
from serving.engine import Engine, LoadedVersion
from serving.errors import ModelNotFound, ServingError
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
    return _response(error_answer(exc))


def _response(answer: Answer) -> Response:
    response = Response(answer.body, status=answer.status, mimetype=answer.content_type)
    response.headers.extend(answer.headers)
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


def _read_body(limit: int) -> bytes:
    return read_body(request.environ, limit)


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
    # NOTE: under gunicorn most requests never get here: controlplane.asgi answers them on its event loop
    # with the same `inference.Call`; this view serves those it declines (inference auth on, cookies).
    services = current_services()
    return _response(
        serve(
            services.engine,
            services.settings,
            name,
            version,
            g.request_id,
            request.headers.get,
            _read_body,
            services.tracing,
        )
    )


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
        "lone_runs": s.lone_runs,  # of execution_count: on the lone-request session, with every core
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
