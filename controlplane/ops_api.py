"""Operational endpoints outside the inference protocol: Prometheus metrics and engine status."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS
from pydantic import Field

from controlplane import metrics
from controlplane.context import current_services
from controlplane.contract import Reply, operation

bp = Blueprint("ops", __name__)


class SlotView(Reply):
    version: str
    provider: str = Field(description="the execution provider the session really got")
    queue_depth: int
    max_batch_size: int
    warmup_s: float


class ModelView(Reply):
    name: str
    ready: bool
    weights: dict[str, int] = Field(description="traffic percent per slot")
    slots: dict[str, SlotView]


class EngineView(Reply):
    node: str = Field(description="the node this process runs on (FLIGHTDECK_NODE)")
    process: str = Field(description="this process's name in status rows (NODE:PID)")
    ready: bool
    draining: bool
    models: list[ModelView]


@bp.get("/metrics")
@operation(media=CONTENT_TYPE_LATEST.split(";")[0])
def prometheus_metrics() -> Response:
    """Prometheus metrics of every process of this server (text format; OpenMetrics, with exemplars, when asked)"""
    services = current_services()
    services.refresh_gauges()
    # NOTE: Prometheus asks for OpenMetrics first when it stores exemplars; everything else gets the text format.
    if "application/openmetrics-text" in request.headers.get("Accept", ""):
        return Response(metrics.render(services.settings.node_name, openmetrics=True), content_type=OPENMETRICS)
    return Response(metrics.render(services.settings.node_name), mimetype=CONTENT_TYPE_LATEST)


@bp.get("/api/engine")
@operation(response=EngineView)
def engine_status() -> dict[str, Any]:
    """Describe what this process serves (and which node and process it is): models, slots, versions, weights, queues."""
    services = current_services()
    engine = services.engine
    models = []
    for name in engine.models():
        slots = {
            v.slot: {
                "version": v.spec.version,
                "provider": v.provider,
                "queue_depth": v.batcher.queue_depth,
                "max_batch_size": v.batcher.max_batch_size,
                "warmup_s": round(v.warmup_s, 3),
            }
            for v in engine.loaded(name)
        }
        models.append(
            {"name": name, "ready": engine.model_ready(name), "weights": engine.weights(name), "slots": slots}
        )
    return {
        "node": services.settings.node_name,
        "process": services.reconciler.process,
        "ready": engine.ready(),
        "draining": engine.draining,
        "models": models,
    }
