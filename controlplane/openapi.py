"""The management API's OpenAPI 3 document, served at /api/openapi.json.

Kept true to the routes by tests/controlplane/test_openapi.py: every /api route is described
here and every path described here is a route.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from controlplane.history.query import METRICS
from controlplane.runbooks.states import RunState

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


_ERR = {"description": "Refused; the message says why", "content": {"application/json": {"schema": _ERROR}}}
_AUTH = {"401": _ERR, "403": _ERR}


def _path(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema or {"type": "string"},
        "description": description,
    }


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


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

# Access control: who may call what is in each operation's `security`; reads need a viewer unless
# FLIGHTDECK_AUTH_READS is off, writes always need an operator (or the role the summary names).
_REFUSED = {"description": "Refused; the message says why", "content": {"application/json": {"schema": _ERROR}}}
_ACCESS_ERRORS = {
    "401": {**_REFUSED, "description": "Not authenticated (WWW-Authenticate: Bearer)"},
    "403": {**_REFUSED, "description": "Role too low, or a cookie request without X-CSRF-Token"},
}
_SECURED = [{"bearer": []}, {"cookie": []}]
_ROLE = {"type": "string", "enum": ["viewer", "operator", "admin"]}
_WHOAMI = {
    "type": "object",
    "properties": {
        "authenticated": {"type": "boolean"},
        "user": {"type": "string", "nullable": True},
        "role": {"type": "string", "nullable": True},
        "kind": {"type": "string", "nullable": True, "enum": ["session", "token", None]},
        "csrf_token": {"type": "string", "nullable": True, "description": "send as X-CSRF-Token on writes"},
    },
}
_SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "An API token (fd_...) from POST /api/tokens"},
    "cookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": "session",
        "description": "The cookie POST /api/session sets; writes also need the X-CSRF-Token header",
    },
}

_BATCHING = {
    "type": "object",
    "description": "the limits in force (a null desired limit shows the answering process's own setting)",
    "properties": {
        "max_batch_size": {"type": "integer"},
        "max_queue_delay_ms": {"type": "number"},
        "max_queue_size": {"type": "integer"},
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
    "/api/models": {
        "get": {
            "summary": "Every model in the registry with its versions",
            "responses": {"200": _ok("Models and versions")},
        },
        "post": {
            "summary": "Push a model version: a tar.gz with model.onnx and manifest.json, validated before it is kept",
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": ["archive"],
                            "properties": {
                                "archive": {"type": "string", "format": "binary"},
                                "sha256": {"type": "string", "description": "refuse unless the archive has this hash"},
                            },
                        }
                    }
                },
            },
            "responses": {
                "201": _ok("The new version"),
                "200": _ok("The same archive was already pushed: the stored version"),
                "400": _ERR,
                **_AUTH,
                "409": _ERR,
                "413": _ERR,
            },
        },
    },
    "/api/models/{name}/versions": {
        "get": {
            "summary": "A model's versions, oldest first",
            "parameters": [_path("name", "Model name")],
            "responses": {"200": _ok("Versions"), "404": _ERR},
        }
    },
    "/api/models/{name}/versions/{version}": {
        "get": {
            "summary": "One version: manifest, SHA-256, size, who pushed it, tags, golden result",
            "parameters": [_path("name", "Model name"), _path("version", "Version")],
            "responses": {"200": _ok("The version"), "404": _ERR},
        },
        "delete": {
            "summary": "Delete a version and its files (refused while deployed)",
            "parameters": [_path("name", "Model name"), _path("version", "Version")],
            "responses": {"204": {"description": "Deleted"}, **_AUTH, "404": _ERR, "409": _ERR},
        },
    },
    "/api/models/{name}/versions/{version}/tags": {
        "put": {
            "summary": "Replace a version's tags; a tag moves off the model's other versions",
            "parameters": [_path("name", "Model name"), _path("version", "Version")],
            "requestBody": _json_body({"type": "array", "items": {"type": "string"}}),
            "responses": {"200": _ok("The version"), "400": _ERR, **_AUTH, "404": _ERR},
        }
    },
    "/api/alerts": {
        "get": {
            "summary": "Alerts, most urgent first",
            "parameters": [
                _query("state", {"type": "string", "enum": ["inactive", "pending", "firing", "resolved"]}, "Filter")
            ],
            "responses": {"200": _ok("Alerts"), "400": _BAD},
        }
    },
    "/api/alerts/{fingerprint}": {
        "get": {
            "summary": "One alert with its timeline",
            "parameters": [_path("fingerprint", "Alert fingerprint")],
            "responses": {"200": _ok("Alert"), "404": _ERR},
        }
    },
    "/api/alerts/{fingerprint}/ack": {
        "post": {
            "summary": "Acknowledge a firing alert (stops repeats)",
            "parameters": [_path("fingerprint", "Alert fingerprint")],
            "responses": {"200": _ok("Alert"), **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/silences": {
        "get": {"summary": "Silences, newest first", "responses": {"200": _ok("Silences")}},
        "post": {
            "summary": "Mute matching alerts' notifications for a while",
            "requestBody": _json_body(
                {
                    "type": "object",
                    "required": ["matchers", "comment"],
                    "properties": {
                        "matchers": {"type": "array", "items": {"type": "object"}},
                        "comment": {"type": "string"},
                        "duration": {"type": "string", "example": "2h"},
                        "starts_at": {"type": "string"},
                        "ends_at": {"type": "string"},
                    },
                }
            ),
            "responses": {"201": _ok("Silence"), "400": _BAD, **_AUTH},
        },
    },
    "/api/silences/{silence_id}": {
        "delete": {
            "summary": "End a silence now",
            "parameters": [_path("silence_id", "Silence id", {"type": "integer"})],
            "responses": {"200": _ok("Silence"), **_AUTH, "404": _ERR},
        }
    },
    "/api/receivers": {
        "get": {"summary": "Chat receivers (secrets and full URLs never shown)", "responses": {"200": _ok("Receivers")}}
    },
    "/api/receivers/{name}": {
        "put": {
            "summary": "Create or replace a receiver",
            "parameters": [_path("name", "Receiver name")],
            "requestBody": _json_body({"type": "object", "required": ["kind", "config"]}),
            "responses": {"200": _ok("Receiver"), "400": _BAD, **_AUTH},
        },
        "delete": {
            "summary": "Delete a receiver",
            "parameters": [_path("name", "Receiver name")],
            "responses": {"204": {"description": "Deleted"}, **_AUTH, "404": _ERR},
        },
    },
    "/api/receivers/{name}/test": {
        "post": {
            "summary": "Send a test message now",
            "parameters": [_path("name", "Receiver name")],
            "responses": {"200": _ok("What the service answered"), **_AUTH, "404": _ERR},
        }
    },
    "/api/runbooks": {
        "get": {
            "summary": "The registered runbooks' declarations (params, role, timeout, automatic, dangerous, steps)",
            "responses": {"200": _ok("Runbooks, and scripts whose declarations are unusable")},
        }
    },
    "/api/runbooks/{name}": {
        "get": {
            "summary": "One runbook's declaration",
            "parameters": [_path("name", "Runbook name")],
            "responses": {"200": _ok("Declaration"), "404": _ERR},
        }
    },
    "/api/runbooks/{name}/runs": {
        "post": {
            "summary": "Run a runbook (operator); a dangerous one waits for a second operator's approval",
            "security": _SECURED,
            "parameters": [_path("name", "Runbook name")],
            "requestBody": _json_body(
                {
                    "type": "object",
                    "properties": {
                        "params": {"type": "object", "description": "checked against the declaration"},
                        "dry_run": {"type": "boolean", "description": "print what it would do; change nothing"},
                        "from_step": {"type": "string", "description": "start at this step"},
                        "reason": {"type": "string"},
                    },
                }
            ),
            "responses": {
                "202": _ok("The run (queued/running, or awaiting_approval)"),
                "400": _BAD,
                **_AUTH,
                "404": _ERR,
                "409": _ERR,
            },
        }
    },
    "/api/runbooks/runs": {
        "get": {
            "summary": "Runbook runs, newest first",
            "parameters": [
                _query("runbook", {"type": "string"}, "Only this runbook's runs"),
                _query(
                    "state",
                    {
                        "type": "string",
                        "enum": [s.value for s in RunState],
                    },
                    "Only runs in this state",
                ),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "At most this many (default 50)"),
            ],
            "responses": {"200": _ok("Runs"), "400": _BAD},
        }
    },
    "/api/runbooks/runs/{run_id}": {
        "get": {
            "summary": "One run with its recorded steps and captured output",
            "parameters": [_path("run_id", "Run id", {"type": "integer"})],
            "responses": {"200": _ok("Run"), "404": _ERR},
        }
    },
    "/api/runbooks/runs/{run_id}/approve": {
        "post": {
            "summary": "Approve a dangerous run as the second operator (never its requester); it starts at once",
            "security": _SECURED,
            "parameters": [_path("run_id", "Run id", {"type": "integer"})],
            "responses": {"200": _ok("Run"), **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/runbooks/runs/{run_id}/reject": {
        "post": {
            "summary": "Refuse a run that has not started (its requester may withdraw it)",
            "security": _SECURED,
            "parameters": [_path("run_id", "Run id", {"type": "integer"})],
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {"schema": {"type": "object", "properties": {"reason": {"type": "string"}}}}
                },
            },
            "responses": {"200": _ok("Run"), **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/runbooks/runs/{run_id}/resume": {
        "post": {
            "summary": "Run a failed or timed-out run again from the step it failed at",
            "security": _SECURED,
            "parameters": [_path("run_id", "Run id", {"type": "integer"})],
            "responses": {"202": _ok("The new run"), **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/models/{name}/deploy": {
        "post": {
            "summary": (
                "Start a rollout: load into the idle slot, verify, then canary steps or a blue-green switch. "
                "For a model not deployed yet, a first deploy: the version goes into blue with all traffic and each "
                "process serves it once loaded and its golden samples pass (202 with first_deploy: true)"
            ),
            "parameters": [_path("name", "Model name")],
            "requestBody": _json_body(
                {
                    "type": "object",
                    "required": ["version"],
                    "properties": {
                        "version": {"type": "string"},
                        "strategy": {"type": "string", "enum": ["canary", "bluegreen"], "default": "canary"},
                        "steps": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 100}},
                        "pause_s": {"type": "number", "minimum": 0},
                        "shadow": {"type": "boolean"},
                        "policy": {"type": "object", "description": "analysis thresholds (see AnalysisPolicy)"},
                    },
                }
            ),
            "responses": {"202": _ok("The rollout"), "400": _BAD, **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/models/{name}/undeploy": {
        "post": {
            "summary": "Stop serving a model: its desired state goes and every process unloads it; its versions stay",
            "security": _SECURED,
            "parameters": [_path("name", "Model name")],
            "responses": {
                "200": _ok("What was undeployed"),
                **_AUTH,
                "404": {**_ERR, "description": "The model is not deployed"},
                "409": {**_ERR, "description": "A rollout of the model is in progress: abort or roll it back first"},
            },
        }
    },
    "/api/models/{name}/rollback": {
        "post": {
            "summary": "One-click rollback: traffic returns to the last stable version at once",
            "parameters": [_path("name", "Model name")],
            "responses": {"200": _ok("What was rolled back"), **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/models/{name}/slots/{slot}/reload": {
        "post": {
            "summary": "Drain one slot and load and verify its version again in every process; traffic returns after",
            "security": _SECURED,
            "parameters": [
                _path("name", "Model name"),
                _path("slot", "Slot to reload", {"type": "string", "enum": ["blue", "green"]}),
            ],
            "responses": {
                "202": _ok(
                    "Reload requested; GET /api/models/{name}/deployment shows each process's slot at this generation",
                    {
                        "type": "object",
                        "properties": {
                            "model": {"type": "string"},
                            "slot": {"type": "string"},
                            "version": {"type": "string"},
                            "generation": {"type": "integer"},
                        },
                    },
                ),
                **_AUTH,
                "404": _ERR,
                "409": {
                    **_ERR,
                    "description": "The slot is empty, or it takes traffic and the other slot is empty",
                },
            },
        }
    },
    "/api/engine/batching": {
        "put": {
            "summary": "Set batching limits for every serving process (generation bumped); null: each process's own",
            "security": _SECURED,
            "requestBody": _json_body(
                {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "max_batch_size": {"type": "integer", "minimum": 1, "nullable": True},
                        "max_queue_delay_ms": {"type": "number", "minimum": 0, "nullable": True},
                        "max_queue_size": {"type": "integer", "minimum": 1, "nullable": True},
                    },
                }
            ),
            "responses": {
                "200": _ok(
                    "The new generation and the limits in force",
                    {
                        "type": "object",
                        "properties": {"generation": {"type": "integer"}, "batching": _BATCHING},
                    },
                ),
                "400": _BAD,
                **_AUTH,
            },
        }
    },
    "/api/engine/compact": {
        "post": {
            "summary": "Ask every serving process to compact its memory once (ONNX Runtime arenas, free heap)",
            "security": _SECURED,
            "responses": {
                "202": _ok(
                    "Compaction requested",
                    {"type": "object", "properties": {"compact_generation": {"type": "integer"}}},
                ),
                **_AUTH,
            },
        }
    },
    "/api/engine/desired": {
        "get": {
            "summary": "Engine-wide desired state, and what each process heard from in the last minute has applied",
            "responses": {
                "200": _ok(
                    "Desired state and processes",
                    {
                        "type": "object",
                        "properties": {
                            "generation": {"type": "integer"},
                            "compact_generation": {"type": "integer"},
                            "batching": _BATCHING,
                            "processes": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "process": {"type": "string"},
                                        "generation": {"type": "integer"},
                                        "compact_generation": {"type": "integer"},
                                        "error": {"type": "string"},
                                        "report": {
                                            "type": "object",
                                            "nullable": True,
                                            "description": "the last compaction's report",
                                        },
                                        "updated_at": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                )
            },
        }
    },
    "/api/models/{name}/deployment": {
        "get": {
            "summary": "Desired slots and weights, what each process reports, recent rollouts",
            "parameters": [_path("name", "Model name")],
            "responses": {"200": _ok("Deployment"), "404": _ERR},
        }
    },
    "/api/rollouts/{rollout_id}": {
        "get": {
            "summary": "A rollout with every step's analysis",
            "parameters": [_path("rollout_id", "Rollout id", {"type": "integer"})],
            "responses": {"200": _ok("Rollout"), "404": _ERR},
        }
    },
    "/api/rollouts/{rollout_id}/{action}": {
        "post": {
            "summary": "Act on a rollout",
            "parameters": [
                _path("rollout_id", "Rollout id", {"type": "integer"}),
                _path(
                    "action",
                    "What to do",
                    {"type": "string", "enum": ["promote", "promote_all", "pause", "resume", "abort"]},
                ),
            ],
            "responses": {"200": _ok("The rollout"), **_AUTH, "404": _ERR, "409": _ERR},
        }
    },
    "/api/session": {
        "get": {
            "summary": "Who the request is authenticated as, and the session's CSRF token",
            "responses": {"200": _ok("Who am I", _WHOAMI)},
        },
        "post": {
            "summary": "Log in with a name and password: sets the session cookie, returns the CSRF token",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["name", "password"],
                            "properties": {"name": {"type": "string"}, "password": {"type": "string"}},
                        }
                    }
                },
            },
            "responses": {
                "200": _ok("Logged in", _WHOAMI),
                "400": _BAD,
                "401": _REFUSED,
                "429": {**_REFUSED, "description": "Too many failed logins; see Retry-After"},
            },
        },
        "delete": {
            "summary": "Log out (a logged-in session must send X-CSRF-Token)",
            "responses": {"204": {"description": "Logged out"}, "403": _REFUSED},
        },
    },
    "/api/users": {
        "get": {
            "summary": "Every user (admin)",
            "security": _SECURED,
            "responses": {"200": _ok("Users"), **_ACCESS_ERRORS},
        },
        "post": {
            "summary": "Create a user (admin)",
            "security": _SECURED,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["name", "password"],
                            "properties": {
                                "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"},
                                "password": {"type": "string", "minLength": 8, "maxLength": 1024},
                                "role": {**_ROLE, "default": "viewer"},
                            },
                        }
                    }
                },
            },
            "responses": {"201": _ok("The user"), "400": _BAD, **_ACCESS_ERRORS, "409": _REFUSED},
        },
    },
    "/api/users/{name}": {
        "patch": {
            "summary": "Change a user's role, disabled flag or password (admin); one enabled admin must remain",
            "security": _SECURED,
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "role": _ROLE,
                                "disabled": {"type": "boolean"},
                                "password": {"type": "string", "minLength": 8, "maxLength": 1024},
                            },
                        }
                    }
                },
            },
            "responses": {"200": _ok("The user"), "400": _BAD, **_ACCESS_ERRORS, "404": _REFUSED, "409": _REFUSED},
        }
    },
    "/api/tokens": {
        "get": {
            "summary": "The caller's API tokens (an admin sees all); never their secrets",
            "security": _SECURED,
            "responses": {"200": _ok("Tokens"), **_ACCESS_ERRORS},
        },
        "post": {
            "summary": "Create an API token with a role up to the caller's; the secret is returned this once only",
            "security": _SECURED,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "role": {**_ROLE, "description": "default: the caller's role"},
                                "ttl_s": {"type": "integer", "minimum": 1, "description": "default: never expires"},
                            },
                        }
                    }
                },
            },
            "responses": {"201": _ok("The token and its secret"), "400": _BAD, **_ACCESS_ERRORS},
        },
    },
    "/api/tokens/{token_id}": {
        "delete": {
            "summary": "Revoke an API token (its owner or an admin)",
            "security": _SECURED,
            "parameters": [{"name": "token_id", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "responses": {"200": _ok("The revoked token"), **_ACCESS_ERRORS, "404": _REFUSED},
        }
    },
    "/api/audit": {
        "get": {
            "summary": "Audit events, newest first (viewer)",
            "security": _SECURED,
            "parameters": [
                _query("since", _TIME, "Only events at or after this time"),
                _query("actor", {"type": "string"}, "Only this actor"),
                _query("action", {"type": "string"}, "Only this action; a trailing * matches a prefix ('token.*')"),
                _query("outcome", {"type": "string", "enum": ["ok", "denied", "error"]}, "Only this outcome"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}, "At most"),
            ],
            "responses": {"200": _ok("Events"), "400": _BAD, **_ACCESS_ERRORS},
        }
    },
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
        "components": {"schemas": {"Error": _ERROR}, "securitySchemes": _SECURITY_SCHEMES},
    }


@bp.get("/api/openapi.json")
def openapi_json() -> Response:
    return jsonify(document())
