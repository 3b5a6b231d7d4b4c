"""Triton's model repository extension over the served set: index, load, unload (operator role).

`load` of a model that is not deployed is its first deploy (the latest version in the registry,
as Triton's default version policy picks); `unload` is an undeploy. Both write the same desired
state as `POST /api/models/<m>/deploy` and `/undeploy`, with the same audit events, and, like
Triton's, answer once this process has applied it: a load returns 200 when the model serves here
and 400 with the reason when its load or golden check failed. Other processes follow within one
reconcile poll. Errors are in the inference protocol's {"error": "..."} form.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, json, request
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.auth import Role, current_actor, record_event, require_role
from controlplane.auth.audit import refusals_recorded
from controlplane.db import get_db
from controlplane.errors import ApiError, NotFound
from controlplane.models import Deployment, ModelVersion, SlotStatus
from controlplane.modelstore import version_key
from controlplane.rollout import deployments
from serving.engine import Engine

bp = Blueprint("repository", __name__, url_prefix="/v2/repository")

READY, UNAVAILABLE, LOADING = "READY", "UNAVAILABLE", "LOADING"  # Triton's model states


def _services():
    return current_app.extensions["flightdeck"]


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
    record_event(session, current_actor(), action, target, outcome, detail)


def _body() -> dict[str, Any]:
    if not request.get_data():
        return {}
    data = request.get_json(silent=True, force=True)  # NOTE: tritonclient sends JSON with no Content-Type
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    return data


def model_state(session: Session, engine: Engine, process: str, name: str, serves_here: bool) -> dict[str, Any]:
    """Describe one registry model as Triton's index does: name, version (when deployed), state and reason."""
    deployment = session.get(Deployment, name)
    if deployment is None:
        return {"name": name, "state": UNAVAILABLE, "reason": "not deployed"}
    entry = {"name": name, "version": deployment.version_in(deployment.stable_slot) or ""}
    if engine.model_ready(name):
        return entry | {"state": READY, "reason": ""}
    if not serves_here:
        return entry | {"state": UNAVAILABLE, "reason": "not served on this node (FLIGHTDECK_LOAD_MODELS)"}
    rows = session.scalars(select(SlotStatus).where(SlotStatus.process == process, SlotStatus.model == name))
    failed = [row.error for row in rows if row.state == "failed"]
    if failed:
        return entry | {"state": UNAVAILABLE, "reason": failed[0]}
    return entry | {"state": LOADING, "reason": "loading and checking its golden samples"}


def _serves_here(name: str) -> bool:
    only = _services().settings.served_models
    return not only or name in only


def _registry_names(session: Session) -> list[str]:
    return list(session.scalars(select(ModelVersion.name).distinct().order_by(ModelVersion.name)))


def _in_registry(session: Session, name: str) -> bool:
    return session.scalars(select(ModelVersion.id).where(ModelVersion.name == name).limit(1)).first() is not None


def _latest_version(session: Session, name: str) -> str:
    versions = list(session.scalars(select(ModelVersion.version).where(ModelVersion.name == name)))
    if not versions:
        raise NotFound(f"model '{name}' is not in the registry; push it first (POST /api/models)")
    return max(versions, key=version_key)


def _apply_here() -> None:
    """Converge this process now (what Triton's synchronous load and unload promise); others poll."""
    _services().reconciler.reconcile()


@bp.post("/index")
@require_role(Role.OPERATOR)
def index() -> Response:
    """Every model in the registry with its state here (READY, LOADING, UNAVAILABLE) and why; {"ready": true} filters."""
    ready_only = bool(_body().get("ready", False))
    services = _services()
    session = get_db()
    entries = [
        model_state(session, services.engine, services.reconciler.process, name, _serves_here(name))
        for name in _registry_names(session)
    ]
    return _json([e for e in entries if e["state"] == READY] if ready_only else entries)


@bp.post("/models/<name>/load")
@require_role(Role.OPERATOR, action="model.deploy")
def load(name: str) -> Response:
    """Serve a model: a first deploy of its latest version if it is not deployed; 200 once it serves here."""
    parameters = _body().get("parameters") or {}
    if not isinstance(parameters, dict) or set(parameters) - {"unload_dependents"}:
        raise ApiError(
            "loading with a config or file override is not supported: push the version to the registry "
            "(POST /api/models), then load it"
        )
    session = get_db()
    if session.get(Deployment, name) is None:
        version = _latest_version(session, name)
        with refusals_recorded(session, current_actor(), "model.deploy", f"{name}:{version}"):
            deployments.first_deploy(session, name, version, _audit)
        session.commit()
    _apply_here()
    session.expire_all()  # NOTE: the reconciler wrote this process's slot reports in its own session
    state = model_state(session, _services().engine, _services().reconciler.process, name, _serves_here(name))
    if _serves_here(name) and state["state"] != READY:
        return _json({"error": f"failed to load '{name}': {state['reason']}"}, 400)
    return _json({})


@bp.post("/models/<name>/unload")
@require_role(Role.OPERATOR, action="model.undeploy")
def unload(name: str) -> Response:
    """Stop serving a model everywhere (an undeploy); 200 once this process unloaded it, or if it was not served."""
    _body()  # unload_dependents: a model here has no dependents
    session = get_db()
    if session.get(Deployment, name) is None:
        if not _in_registry(session, name):
            raise NotFound(f"unknown model '{name}'")
        return _json({})
    with refusals_recorded(session, current_actor(), "model.undeploy", name):
        deployments.undeploy(session, name, _audit)
    session.commit()
    _apply_here()
    return _json({})
