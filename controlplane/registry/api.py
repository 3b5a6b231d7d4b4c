"""The registry API: push (multipart upload), list, show, tag and delete model versions under /api/models."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request, url_for
from sqlalchemy.orm import Session

from controlplane.auth import Role, current_actor, record_event, require_role
from controlplane.errors import ApiError, NotFound
from controlplane.registry.service import Registry, version_dict
from controlplane.rollout.service import deployed_check

bp = Blueprint("registry", __name__, url_prefix="/api/models")

FORM_OVERHEAD_BYTES = 64 * 1024  # multipart boundaries, part headers and the sha256 field around the archive


def _registry() -> Registry:
    services = current_app.extensions["flightdeck"]
    return Registry.for_settings(services.sessions, services.settings)


def _audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
    record_event(session, current_actor(), action, target, outcome, detail)


def _actor_name() -> str:
    actor = current_actor()
    return actor.name if actor is not None else "anonymous"


@bp.post("")
@require_role(Role.OPERATOR, action="model.push")
def push() -> tuple[Response, int, dict[str, str]]:
    """Push a model archive: multipart field 'archive', optional form field 'sha256' to check it against."""
    settings = current_app.extensions["flightdeck"].settings
    # NOTE: set before the form is parsed; a larger body is refused with 413 before it is read.
    request.max_content_length = settings.max_archive_bytes + FORM_OVERHEAD_BYTES
    upload = request.files.get("archive")
    if upload is None:
        raise ApiError("send the archive as multipart/form-data field 'archive'")
    sha256 = request.form.get("sha256") or None
    row, created = _registry().push(upload.stream, _actor_name(), sha256, audit=_audit)
    location = url_for("registry.show", name=row.name, version=row.version)
    return jsonify(version_dict(row)), 201 if created else 200, {"Location": location}


@bp.get("")
def list_models() -> Response:
    """List every model in the registry with its versions."""
    models: dict[str, list[dict[str, Any]]] = {}
    for row in _registry().list():
        models.setdefault(row.name, []).append(version_dict(row))
    return jsonify({"models": [{"name": name, "versions": versions} for name, versions in models.items()]})


@bp.get("/<name>/versions")
def list_versions(name: str) -> Response:
    """List one model's versions, oldest first."""
    rows = _registry().list(name)
    if not rows:
        raise NotFound(f"model '{name}' has no versions in the registry")
    return jsonify({"name": name, "versions": [version_dict(r) for r in rows]})


@bp.get("/<name>/versions/<version>")
def show(name: str, version: str) -> Response:
    """Show one version: manifest, SHA-256, size, who pushed it, tags, golden result."""
    return jsonify(version_dict(_registry().get(name, version), manifest=True))


@bp.put("/<name>/versions/<version>/tags")
@require_role(Role.OPERATOR, action="model.tag")
def set_tags(name: str, version: str) -> Response:
    """Replace a version's tags with the JSON list in the body; a tag moves off the model's other versions."""
    tags = request.get_json(silent=True)
    if not isinstance(tags, list):
        raise ApiError('the request body must be a JSON list of tags, e.g. ["stable"]')
    return jsonify(version_dict(_registry().tag(name, version, tags, _actor_name(), audit=_audit)))


@bp.delete("/<name>/versions/<version>")
@require_role(Role.OPERATOR, action="model.delete")
def delete(name: str, version: str) -> tuple[str, int]:
    """Delete a version and its files; refused with 409 while it is deployed."""
    deployed = deployed_check(current_app.extensions["flightdeck"].sessions)
    _registry().delete(name, version, _actor_name(), deployed=deployed, audit=_audit)
    return "", 204
