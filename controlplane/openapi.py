"""The management API's OpenAPI 3 document, served at /api/openapi.json.

Kept true to the routes by tests/controlplane/test_openapi.py: every /api route is described
here and every path described here is a route.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from controlplane.history.query import METRICS

bp = Blueprint("openapi", __name__)

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "request_id"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "request_id": {"type": "string"}},
        }
    },
}
_TIME = {"type": "string", "description": "'now', a relative time such as -15m, -6h, -7d, or ISO 8601 (UTC by default)"}


def _query(name: str, schema: dict[str, Any], description: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": description}


def _ok(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema or {"type": "object"}}}}


_BAD = {
    "description": "A parameter is wrong; the message names it",
    "content": {"application/json": {"schema": _ERROR}},
}
_RANGE = [
    _query("start", _TIME, "Start of the range (default -1h)"),
    _query("end", _TIME, "End of the range (default now)"),
]
_SERIES = {
    "type": "object",
    "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "points": {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2}},
    },
}

PATHS: dict[str, dict[str, Any]] = {
    "/api/engine": {
        "get": {
            "summary": "What this process serves: slots, versions, providers, traffic weights, queues",
            "responses": {"200": _ok("Engine status")},
        }
    },
    "/api/history": {
        "get": {
            "summary": "One metric over a time range, one series per model/version/slot or device",
            "parameters": [
                _query("metric", {"type": "string", "enum": sorted(METRICS)}, "The metric", required=True),
                *_RANGE,
                _query("step", {"type": "integer", "minimum": 1, "default": 60}, "Seconds per point"),
                _query("model", {"type": "string"}, "Only this model"),
                _query("version", {"type": "string"}, "Only this version"),
                _query("slot", {"type": "string", "enum": ["blue", "green"]}, "Only this slot"),
            ],
            "responses": {
                "200": _ok(
                    "Series",
                    {
                        "type": "object",
                        "properties": {
                            "metric": {"type": "string"},
                            "unit": {"type": "string"},
                            "step": {"type": "integer"},
                            "series": {"type": "array", "items": _SERIES},
                        },
                    },
                ),
                "400": _BAD,
            },
        }
    },
    "/api/history/summary": {
        "get": {
            "summary": "Key figures per model/version/slot over a time range",
            "parameters": [*_RANGE, _query("model", {"type": "string"}, "Only this model")],
            "responses": {"200": _ok("Summary rows"), "400": _BAD},
        }
    },
    "/api/history/metrics": {
        "get": {"summary": "The metrics the history answers, with units", "responses": {"200": _ok("Catalog")}}
    },
    "/api/dashboards/figures": {
        "get": {
            "summary": "The dashboard's Plotly figures for a model and range",
            "parameters": [
                _query("model", {"type": "string"}, "Model (default: all)"),
                _query("range", {"type": "string", "enum": ["15m", "1h", "6h", "24h", "7d"]}, "Time range"),
            ],
            "responses": {"200": _ok("Figures"), "400": _BAD},
        }
    },
    "/api/openapi.json": {"get": {"summary": "This document", "responses": {"200": _ok("OpenAPI 3 document")}}},
}


def document() -> dict[str, Any]:
    """Return the OpenAPI document."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Flightdeck management API",
            "version": "0.1.0",
            "description": "Everything outside /v2 (the Open Inference Protocol). Errors use one envelope.",
        },
        "paths": PATHS,
        "components": {"schemas": {"Error": _ERROR}},
    }


@bp.get("/api/openapi.json")
def openapi_json() -> Response:
    return jsonify(document())
