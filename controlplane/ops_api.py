"""Operational endpoints outside the inference protocol: Prometheus metrics and engine status."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST

from controlplane import metrics

bp = Blueprint("ops", __name__)


@bp.get("/metrics")
def prometheus_metrics() -> Response:
    services = current_app.extensions["flightdeck"]
    services.refresh_gauges()
    return Response(metrics.render(), mimetype=CONTENT_TYPE_LATEST)


@bp.get("/api/engine")
def engine_status() -> Response:
    """Describe what this process serves: models, slots, versions, providers, weights, queues."""
    engine = current_app.extensions["flightdeck"].engine
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
    return jsonify({"ready": engine.ready(), "draining": engine.draining, "models": models})
