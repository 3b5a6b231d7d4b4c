"""The OpenAPI 3.1 document, generated from the routes and their contracts, and the API page.

`/api/openapi.json` walks the application's URL map: every route under /api and /v2, and /metrics,
becomes an operation whose parameters, bodies and answers come from the pydantic models its
`@operation` declares (`controlplane.contract`), whose security comes from its guard (`require_role`,
`public`, or the app-wide rule for undeclared views), and whose summary is the view's docstring.
Nothing here is written twice: a route without a contract is still documented (generic answers),
and tests/controlplane/test_openapi.py refuses one.

`/api/docs` is Swagger UI, served from the `flask-openapi3-swagger` package's files: no CDN, so it
works on a machine with no internet.
"""

from __future__ import annotations

import importlib.resources
import inspect
import re
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, render_template_string, send_from_directory
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from controlplane import __version__
from controlplane.auth.guard import ACCESS, MUTATING, OPEN_READS, PUBLIC, public
from controlplane.auth.roles import Role
from controlplane.contract import CONTRACT, JSON, MAX_ROW_ID, Contract, operation
from controlplane.schemas import ErrorEnvelope, OipError

bp = Blueprint("openapi", __name__)

CACHE = "flightdeck.openapi"  # app.extensions key: the document, built once per app
DOCUMENTED = re.compile(r"^(/api/|/v2$|/v2/|/metrics$)")
_ARG = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")
_REF = "#/components/schemas/{model}"
_SECURED = [{"bearer": []}, {"cookie": []}]
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "An API token (fd_...) from POST /api/tokens"},
    "cookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": "session",
        "description": "The cookie POST /api/session sets; writes also need the X-CSRF-Token header",
    },
}
_CONVERTERS = {
    "int": {"type": "integer", "minimum": 0, "maximum": MAX_ROW_ID},
    "float": {"type": "number"},
    "path": {"type": "string"},
}


def _openapi_path(rule: str) -> str:
    return _ARG.sub(r"{\2}", rule)


class _Schemas:
    """Collect every model the operations name, then render them once as components."""

    def __init__(self) -> None:
        self._wanted: dict[tuple[int, JsonSchemaMode], tuple[Any, JsonSchemaMode, TypeAdapter[Any]]] = {}

    def ref(self, kind: Any, mode: JsonSchemaMode) -> dict[str, Any]:
        """Return a placeholder for `kind`'s schema, filled in by `resolve`."""
        key = (id(kind), mode)
        self._wanted.setdefault(key, (kind, mode, TypeAdapter(kind)))
        return {"$schema-of": key}

    def resolve(self, document: dict[str, Any]) -> None:
        """Replace each placeholder with its schema (a $ref for models) and fill components.schemas."""
        inputs = [(key, mode, adapter) for key, (_, mode, adapter) in self._wanted.items()]
        found, defs = TypeAdapter.json_schemas(inputs, ref_template=_REF) if inputs else ({}, {})
        schemas = {key: schema for (key, _), schema in found.items()}
        document["components"]["schemas"].update(defs.get("$defs", {}))

        def walk(node: Any) -> Any:
            if isinstance(node, dict):
                if "$schema-of" in node:
                    return schemas[node["$schema-of"]]
                return {k: walk(v) for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v) for v in node]
            return node

        document["paths"] = walk(document["paths"])


def _query_parameters(model: type[BaseModel], components: dict[str, Any]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=_REF, mode="validation")
    components.update(schema.pop("$defs", {}))  # enums a parameter refers to (a Slot, say)
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema.get("properties", {}).items():
        description = prop.pop("description", None) or prop.get("title", name)
        prop.pop("title", None)
        params.append(
            {"name": name, "in": "query", "required": name in required, "schema": prop, "description": description}
        )
    return params


def _security(view: Any, path: str, method: str) -> tuple[list[dict[str, list[str]]] | None, str | None]:
    """Return the operation's security requirement and the role it needs (None: open)."""
    access = getattr(view, ACCESS, None)
    if access == PUBLIC:
        return [], None
    if isinstance(access, Role):
        return _SECURED, access.value
    if path.startswith("/v2"):
        # FLIGHTDECK_INFERENCE_AUTH: a token of any role when on; anonymous when off (the default).
        return [{}, {"bearer": []}], None
    if method.upper() in MUTATING:
        return _SECURED, Role.OPERATOR.value
    if path.startswith("/api/") and path not in OPEN_READS:
        return _SECURED, Role.VIEWER.value  # unless FLIGHTDECK_AUTH_READS is off
    return [], None


def _error(description: str, v2: bool) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": {"$ref": _REF.format(model=_envelope(v2))}}}}


def _envelope(v2: bool) -> str:
    return OipError.__name__ if v2 else ErrorEnvelope.__name__


def _operation(app: Flask, rule: Any, method: str, schemas: _Schemas, components: dict[str, Any]) -> dict[str, Any]:
    view = app.view_functions[rule.endpoint]
    contract: Contract = getattr(view, CONTRACT, None) or Contract(runtime=False)
    path = rule.rule
    v2 = path.startswith("/v2")
    doc = inspect.getdoc(view) or ""
    summary, _, description = doc.partition("\n")
    args = [name for _, name in _ARG.findall(path)]
    # NOTE: one view may serve several paths (with and without a version): the arguments tell them apart.
    siblings = [r for r in app.url_map.iter_rules() if r.endpoint == rule.endpoint]
    suffix = ("." + "_".join(args or ["all"])) if len(siblings) > 1 else ""
    op: dict[str, Any] = {
        "operationId": f"{rule.endpoint}{suffix}.{method}",
        "summary": contract.summary or summary.strip() or rule.endpoint,
        "tags": list(contract.tags) or [rule.endpoint.split(".")[0]],
    }
    if description.strip():
        op["description"] = description.strip()
    params = []
    for converter, name in _ARG.findall(path):
        param = {"name": name, "in": "path", "required": True, "schema": _CONVERTERS.get(converter, {"type": "string"})}
        if name in contract.path:
            param["description"] = contract.path[name]
        params.append(param)
    if contract.query is not None:
        params += _query_parameters(contract.query, components)
    if params:
        op["parameters"] = params
    if contract.body is not None:
        op["requestBody"] = {
            "required": contract.body_required,
            "content": {contract.body_media: {"schema": schemas.ref(contract.body, "validation")}},
        }
    responses: dict[str, Any] = {}
    answers = {contract.status: ("Done", contract.response), **contract.also}
    for status, (words, kind) in answers.items():
        entry: dict[str, Any] = {"description": words}
        if status != 204:
            media = contract.media if status == contract.status else JSON
            schema = schemas.ref(kind, "serialization") if kind is not None else {}
            entry["content"] = {media: {"schema": schema}}
        responses[str(status)] = entry
    security, role = _security(view, path, method)
    if contract.body is not None or contract.query is not None or params:
        responses.setdefault("400", _error("The request is wrong; the message names the field", v2))
    if contract.body is not None and contract.body_media == JSON and contract.runtime and not path.startswith("/v2"):
        responses.setdefault("415", _error("The body is not sent as Content-Type: application/json", v2))
    if security:
        responses.setdefault("401", _error("Not authenticated (WWW-Authenticate: Bearer)", v2))
        if role is not None:
            responses.setdefault("403", _error("Role too low, or a cookie write without X-CSRF-Token", v2))
    if method.upper() in MUTATING and not path.startswith("/v2"):
        responses.setdefault("403", _error("A cross-site request (its Origin or Sec-Fetch-Site), refused", v2))
    for status, words in contract.errors.items():
        responses[str(status)] = _error(words, v2)
    op["responses"] = dict(sorted(responses.items()))
    op["security"] = security
    if role is not None:
        op["x-required-role"] = role
    return op


def build_document(app: Flask) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of every /api and /v2 route of `app`, and /metrics."""
    schemas = _Schemas()
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Flightdeck API",
            "version": __version__,
            "description": (
                "The management API (/api, errors in one envelope) and the Open Inference Protocol "
                '(/v2, KServe v2, errors as {"error": "..."}). Reads under /api need a viewer unless '
                "FLIGHTDECK_AUTH_READS is off; /v2 needs a token only with FLIGHTDECK_INFERENCE_AUTH."
            ),
        },
        "servers": [{"url": "/"}],
        "security": _SECURED,
        "paths": {},
        "components": {"schemas": {}, "securitySchemes": SECURITY_SCHEMES},
    }
    schemas.ref(ErrorEnvelope, "serialization")
    schemas.ref(OipError, "serialization")
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if not DOCUMENTED.match(rule.rule):
            continue
        item = document["paths"].setdefault(_openapi_path(rule.rule), {})
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            item[method.lower()] = _operation(app, rule, method.lower(), schemas, document["components"]["schemas"])
    schemas.resolve(document)
    return document


def document() -> dict[str, Any]:
    """Return this application's document, built on first use."""
    cached = current_app.extensions.get(CACHE)
    if cached is None:
        cached = current_app.extensions[CACHE] = build_document(current_app)
    return cached


@bp.get("/api/openapi.json")
@operation(response=dict[str, Any], runtime=False)
def openapi_json() -> Response:
    """This document: the OpenAPI 3.1 description of the API"""
    return jsonify(document())


_SWAGGER = importlib.resources.files("flask_openapi3_swagger") / "templates" / "swagger"
_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Flightdeck API</title>
<link rel="stylesheet" href="{{ url_for('openapi.docs_asset', filename='css/swagger-ui.css') }}"></head>
<body><div id="swagger-ui" data-spec="{{ url_for('openapi.openapi_json') }}"></div>
<script src="{{ url_for('openapi.docs_asset', filename='js/swagger-ui-bundle.js') }}"></script>
<script src="{{ url_for('openapi.docs_asset', filename='start.js') }}"></script>
</body></html>"""
# NOTE: in a file, not inline, so the page works under a CSP without 'unsafe-inline'.
_START = """window.ui = SwaggerUIBundle({
  url: document.getElementById("swagger-ui").dataset.spec, dom_id: "#swagger-ui",
  deepLinking: true, withCredentials: true,
  requestInterceptor: (req) => {
    const csrf = sessionStorage.getItem("flightdeck.csrf");
    if (csrf && req.method !== "GET") req.headers["X-CSRF-Token"] = csrf;
    return req;
  },
  responseInterceptor: (res) => {
    if (res.url.endsWith("/api/session") && res.body && res.body.csrf_token)
      sessionStorage.setItem("flightdeck.csrf", res.body.csrf_token);
    return res;
  },
});
"""


@bp.get("/api/docs")
@public
@operation(media="text/html", runtime=False)
def docs() -> str:
    """The interactive API page (Swagger UI, served from the installed package)"""
    return render_template_string(_DOCS_PAGE)


@bp.get("/api/docs/assets/<path:filename>")
@public
@operation(media="application/octet-stream", runtime=False, errors={404: "No such file"})
def docs_asset(filename: str) -> Response:
    """Swagger UI's files"""
    if filename == "start.js":
        return Response(_START, mimetype="text/javascript")
    return send_from_directory(str(_SWAGGER), filename, max_age=3600)
