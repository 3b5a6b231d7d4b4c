"""The registry API: push (multipart upload), list, show, tag and delete model versions under /api/models."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, request, url_for

from controlplane.auth import Role
from controlplane.auth.guard import current_actor, request_audit, require_role
from controlplane.context import current_services
from controlplane.contract import operation
from controlplane.errors import ApiError, NotFound
from controlplane.registry.schemas import ModelList, ModelVersions, PushForm, Tags, VersionDetail, VersionView
from controlplane.registry.service import Registry, version_dict
from controlplane.rollout.service import deployed_check

bp = Blueprint("registry", __name__, url_prefix="/api/models")

FORM_OVERHEAD_BYTES = 64 * 1024  # multipart boundaries, part headers and the sha256 field around the archive


def _registry() -> Registry:
    return current_services().registry


def _actor_name() -> str:
    actor = current_actor()
    return actor.name if actor is not None else "anonymous"


@bp.post("")
@require_role(Role.OPERATOR, action="model.push")
@operation(
    body=PushForm, body_media="multipart/form-data", response=VersionView, status=201,
    also={200: ("The same archive was pushed before: the stored version", VersionView)},
    errors={409: "The version exists with other contents", 413: "The archive is larger than FLIGHTDECK_MAX_ARCHIVE_BYTES"},
)  # fmt: skip
def push() -> tuple[dict[str, Any], int, dict[str, str]]:
    """Push a model archive: multipart field 'archive', optional form field 'sha256' to check it against."""
    settings = current_services().settings
    # NOTE: set before the form is parsed; a larger body is refused with 413 before it is read.
    request.max_content_length = settings.max_archive_bytes + FORM_OVERHEAD_BYTES
    upload = request.files.get("archive")
    if upload is None:
        raise ApiError("send the archive as multipart/form-data field 'archive'")
    sha256 = request.form.get("sha256") or None
    row, created = _registry().push(upload.stream, _actor_name(), sha256, audit=request_audit)
    location = url_for("registry.show", name=row.name, version=row.version)
    return version_dict(row), 201 if created else 200, {"Location": location}


@bp.get("")
@operation(response=ModelList)
def list_models() -> dict[str, Any]:
    """List every model in the registry with its versions."""
    models: dict[str, list[dict[str, Any]]] = {}
    for row in _registry().list():
        models.setdefault(row.name, []).append(version_dict(row))
    return {"models": [{"name": name, "versions": versions} for name, versions in models.items()]}


@bp.get("/<name>/versions")
@operation(response=ModelVersions, errors={404: "The model has no versions"})
def list_versions(name: str) -> dict[str, Any]:
    """List one model's versions, oldest first."""
    rows = _registry().list(name)
    if not rows:
        raise NotFound(f"model '{name}' has no versions in the registry")
    return {"name": name, "versions": [version_dict(r) for r in rows]}


@bp.get("/<name>/versions/<version>")
@operation(response=VersionDetail, errors={404: "No such version"})
def show(name: str, version: str) -> dict[str, Any]:
    """Show one version: manifest, SHA-256, size, who pushed it, tags, golden result."""
    return version_dict(_registry().get(name, version), manifest=True)


@bp.put("/<name>/versions/<version>/tags")
@require_role(Role.OPERATOR, action="model.tag")
@operation(body=Tags, response=VersionView, errors={404: "No such version"})
def set_tags(name: str, version: str, body: Tags) -> dict[str, Any]:
    """Replace a version's tags with the JSON list in the body; a tag moves off the model's other versions."""
    return version_dict(_registry().tag(name, version, body.root, _actor_name(), audit=request_audit))


@bp.delete("/<name>/versions/<version>")
@require_role(Role.OPERATOR, action="model.delete")
@operation(status=204, errors={404: "No such version", 409: "The version is deployed"})
def delete(name: str, version: str) -> tuple[str, int]:
    """Delete a version and its files; refused with 409 while it is deployed."""
    deployed = deployed_check(current_services().sessions)
    _registry().delete(name, version, _actor_name(), deployed=deployed, audit=request_audit)
    return "", 204
