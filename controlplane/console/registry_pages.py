"""The Models page: every model in the registry, served or not, with push, first deploy and undeploy.

The page reads the registry and the `deployments` rows; its three actions are forms console.js and
models.js send to the JSON API (`POST /api/models`, `/api/models/<m>/deploy`, `/api/models/<m>/undeploy`).
"""

from __future__ import annotations

from typing import Any

from flask import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.console.base import bp, login_required, page
from controlplane.console.model_status import (
    firing_by_model,
    first_deploy_words,
    health,
    live_figures,
    live_versions,
    loaded_somewhere,
    model_ready,
    model_versions,
    undeploy_words,
)
from controlplane.context import current_services, get_db
from controlplane.models import Deployment
from controlplane.rollout.readmodel import describe_deployment
from controlplane.rollout.states import ACTIVE

MODELS_REFRESH_S = 5


def _names(db: Session) -> list[str]:
    """Every model the registry holds, plus any served from elsewhere (the plain store, until it goes)."""
    registry = current_services().registry
    pushed = {row.name for row in registry.list()}
    return sorted(pushed | set(db.scalars(select(Deployment.model))) | set(current_services().engine.models()))


def serving_state(deployment: dict[str, Any] | None, ready: bool) -> str:
    """Return 'not served', 'starting' (deployed, no process serves it yet), 'failed' (its load failed) or 'served'."""
    if deployment is None:
        return "not served"
    if ready or loaded_somewhere(deployment):
        return "served"
    return "failed" if any(p["state"] == "failed" for p in deployment["processes"]) else "starting"


def describe_model(db: Session, name: str, figures: dict, firing: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Return one model as the Models page shows it: state, versions, what is live, what may be done."""
    deployment = describe_deployment(db, name, current_services().settings.liveness)
    versions = model_versions(name)
    ready = model_ready(name, deployment)
    level, words = health(deployment, ready, firing.get(name, []))
    state = serving_state(deployment, ready)
    live = live_versions(deployment, figures)
    active = next((r for r in (deployment or {}).get("rollouts", []) if r["state"] in ACTIVE), None)
    latest = versions[-1] if versions else None
    return {
        "name": name,
        "served": deployment is not None,
        "state": state,
        "level": level,
        "health": words.removeprefix(f"{state}: "),  # the badge says "starting" already
        "versions": versions,
        "description": latest["description"] if latest else "",
        "live": live,
        "active_rollout": active,
        "undeploy_words": undeploy_words(name, live, len(versions)),
        "first_deploy_words": first_deploy_words(name),
    }


@bp.get("/models")
@login_required
def models() -> Response:
    """Every model in the registry: served or not, its versions, what is live; push, deploy, undeploy."""
    db = get_db()
    figures, firing = live_figures(), firing_by_model(db)
    listed = [describe_model(db, name, figures, firing) for name in _names(db)]
    return page(
        "console/models.html",
        models=listed,
        max_archive_bytes=current_services().settings.max_archive_bytes,
        refresh_s=MODELS_REFRESH_S,
    )
