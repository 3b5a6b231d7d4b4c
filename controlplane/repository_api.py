"""Triton's model repository extension over the served set: index, load, unload (operator role).

`load` of a model that is not deployed is its first deploy (the latest version in the registry,
as Triton's default version policy picks); `unload` is an undeploy. Both write the same desired
state as `POST /api/models/<m>/deploy` and `/undeploy`, with the same audit events, and, like
Triton's, answer once this process has applied it: a load returns 200 when the model serves here
and 400 with the reason when its load or golden check failed. Other processes follow within one
reconcile poll. Errors are in the inference protocol's {"error": "..."} form.

Bodies are typed (unknown fields refused) and may be left out; they are read as JSON whatever the
Content-Type says, since tritonclient sends none.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from flask import Blueprint
from pydantic import Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.auth import Role
from controlplane.auth.audit import refusals_recorded
from controlplane.auth.guard import current_actor, request_audit, require_role
from controlplane.context import current_services, get_db
from controlplane.contract import Reply, RequestBody, operation
from controlplane.errors import ApiError, NotFound
from controlplane.models import Deployment, ModelVersion, SlotStatus
from controlplane.registry.plainstore import version_key
from controlplane.rollout import deployments
from serving.engine import Engine

bp = Blueprint("repository", __name__, url_prefix="/v2/repository")

NO_OVERRIDES = (
    "loading with a config or file override is not supported: push the version to the registry "
    "(POST /api/models), then load it"
)


class TritonModelState(enum.StrEnum):
    """Triton's model states, as its repository index shows them."""

    READY = "READY"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"


READY, UNAVAILABLE, LOADING = TritonModelState.READY, TritonModelState.UNAVAILABLE, TritonModelState.LOADING


class RepositoryIndexRequest(RequestBody):
    """Triton's index request; the body may be left out."""

    ready: bool = Field(False, description="only the models ready here")


class RepositoryUnloadParameters(RequestBody):
    """Triton's unload parameters."""

    unload_dependents: bool = Field(False, description="accepted and ignored: a model here has no dependents")


class RepositoryLoadParameters(RepositoryUnloadParameters):
    """Triton's load parameters: a config or file override ("config", "file:...") is refused."""

    @model_validator(mode="before")
    @classmethod
    def _no_overrides(cls, data: Any) -> Any:
        if not isinstance(data, dict) or set(data) - set(cls.model_fields):
            raise ApiError(NO_OVERRIDES)  # passes through pydantic as it is: the answer names what to do
        return data


class RepositoryLoadRequest(RequestBody):
    """Triton's load request; the body may be left out."""

    parameters: RepositoryLoadParameters | None = None


class RepositoryUnloadRequest(RequestBody):
    """Triton's unload request; the body may be left out."""

    parameters: RepositoryUnloadParameters | None = None


class RepositoryModel(Reply):
    """A deployed model: the stable slot's version and its state in this process."""

    name: str
    version: str
    state: TritonModelState
    reason: str = Field(description="empty when READY; else why not")


class RepositoryUndeployedModel(Reply):
    """A model in the registry that is not deployed."""

    name: str
    state: Literal[TritonModelState.UNAVAILABLE]
    reason: Literal["not deployed"]


class RepositoryDone(Reply):
    """Triton's answer to a load or unload that worked: an empty object."""


RepositoryIndexEntry = RepositoryModel | RepositoryUndeployedModel


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
    only = current_services().settings.served_models
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
    current_services().reconciler.reconcile()


@bp.post("/index")
@require_role(Role.OPERATOR)
@operation(body=RepositoryIndexRequest, body_required=False, response=list[RepositoryIndexEntry])
def index(body: RepositoryIndexRequest) -> list[dict[str, Any]]:
    """Every model in the registry with its state here (READY, LOADING, UNAVAILABLE) and why; {"ready": true} filters."""
    services = current_services()
    session = get_db()
    entries = [
        model_state(session, services.engine, services.reconciler.process, name, _serves_here(name))
        for name in _registry_names(session)
    ]
    return [e for e in entries if e["state"] == READY] if body.ready else entries


@bp.post("/models/<name>/load")
@require_role(Role.OPERATOR, action="model.deploy")
@operation(
    body=RepositoryLoadRequest, body_required=False, response=RepositoryDone,
    errors={400: "A config or file override, or the load or its golden check failed here", 404: "Not in the registry"},
)  # fmt: skip
def load(name: str, body: RepositoryLoadRequest) -> dict[str, Any]:
    """Serve a model: a first deploy of its latest version if it is not deployed; 200 once it serves here."""
    del body  # checked by the contract: no overrides, only unload_dependents
    session = get_db()
    if session.get(Deployment, name) is None:
        version = _latest_version(session, name)
        with refusals_recorded(session, current_actor(), "model.deploy", f"{name}:{version}"):
            deployments.first_deploy(session, name, version, request_audit)
        session.commit()
    _apply_here()
    session.expire_all()  # NOTE: the reconciler wrote this process's slot reports in its own session
    services = current_services()
    state = model_state(session, services.engine, services.reconciler.process, name, _serves_here(name))
    if _serves_here(name) and state["state"] != READY:
        raise ApiError(f"failed to load '{name}': {state['reason']}")
    return {}


@bp.post("/models/<name>/unload")
@require_role(Role.OPERATOR, action="model.undeploy")
@operation(
    body=RepositoryUnloadRequest, body_required=False, response=RepositoryDone, errors={404: "Not in the registry"}
)
def unload(name: str, body: RepositoryUnloadRequest) -> dict[str, Any]:
    """Stop serving a model everywhere (an undeploy); 200 once this process unloaded it, or if it was not served."""
    del body  # unload_dependents: a model here has no dependents
    session = get_db()
    if session.get(Deployment, name) is None:
        if not _in_registry(session, name):
            raise NotFound(f"unknown model '{name}'")
        return {}
    with refusals_recorded(session, current_actor(), "model.undeploy", name):
        deployments.undeploy(session, name, request_audit)
    session.commit()
    _apply_here()
    return {}
