"""The overview (every model at a glance) and a model's page (versions, slots, rollout, actions, charts)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.clock import utcnow
from controlplane.cluster import describe_cluster
from controlplane.console.base import bp, login_required, page
from controlplane.console.model_status import (
    FIGURES_WINDOW,
    firing_by_model,
    first_deploy_words,
    health,
    live_figures,
    live_versions,
    model_ready,
    model_versions,
    undeploy_words,
)
from controlplane.context import current_services, get_db
from controlplane.errors import ApiError, NotFound
from controlplane.models import Deployment
from controlplane.rollout import service as rollouts
from controlplane.rollout.readmodel import ACTIONS, describe_deployment, describe_rollout
from controlplane.rollout.states import ACTIVE, RolloutState, allowed_events

OVERVIEW_REFRESH_S = 5
MODEL_REFRESH_S = 3


def _model_names(db: Session) -> list[str]:
    deployed = set(db.scalars(select(Deployment.model)))
    return sorted(deployed | set(current_services().engine.models()))


@bp.get("/")
@login_required
def overview() -> Response:
    """Every model's health, live versions and split, rate, p99, error rate, and the firing alerts."""
    db = get_db()
    engine = current_services().engine
    firing = firing_by_model(db)
    figures = live_figures()
    models = []
    for name in _model_names(db):
        deployment = describe_deployment(db, name, current_services().settings.liveness)
        level, words = health(deployment, model_ready(name, deployment), firing.get(name, []))
        models.append({"name": name, "level": level, "health": words, "versions": live_versions(deployment, figures),
                       "alerts": firing.get(name, [])})  # fmt: skip
    others = [a for key, alerts in firing.items() if key not in {m["name"] for m in models} for a in alerts]
    return page(
        "console/overview.html",
        models=models,
        alerts=[a for m in models for a in m["alerts"]] + others,
        window_m=int(FIGURES_WINDOW.total_seconds() // 60),
        refresh_s=OVERVIEW_REFRESH_S,
        draining=engine.draining,
        cluster=describe_cluster(db, utcnow(), current_services().settings.liveness),
        this_node=current_services().settings.node_name,
    )


def _rollback_plan(db: Session, name: str) -> dict[str, Any]:
    try:
        plan = rollouts.plan_rollback(db, name, current_services().settings.rollout)
    except ApiError as exc:
        return {"possible": False, "why": exc.message}
    if plan.active is not None:
        what = (f"Stops rollout #{plan.active.id}: all traffic for {name} returns to version {plan.version} "
                f"(slot {plan.slot}) at once, and version {plan.replacing} is taken out.")  # fmt: skip
    elif plan.reloaded:
        what = (f"Version {plan.version} of {name} is loaded into slot {plan.slot} again and checked; then all "
                f"traffic moves from version {plan.replacing} to it.")  # fmt: skip
    else:
        what = f"All traffic for {name} returns to version {plan.version} (slot {plan.slot}) at once; version {plan.replacing} stays loaded."
    return {"possible": True, "version": plan.version, "what": what}


@bp.get("/models/<name>")
@login_required
def model(name: str) -> Response:
    """A model: versions, slots and processes, the rollout in progress, the actions, and its charts."""
    db = get_db()
    versions = model_versions(name)
    deployment = describe_deployment(db, name, current_services().settings.liveness)
    if deployment is None and not versions:
        raise NotFound(f"no model named {name!r}")
    active = last_rollout = None
    if deployment:
        current = next((r for r in deployment["rollouts"] if r["state"] in ACTIVE), None)
        if current is not None:
            active = describe_rollout(db, current["id"])
            events = allowed_events(RolloutState(current["state"]))
            active["actions"] = [a for a in ACTIONS if a in events]
        elif deployment["rollouts"]:  # why the last one moved or stopped, with its evidence
            last_rollout = describe_rollout(db, deployment["rollouts"][0]["id"])
    firing = firing_by_model(db).get(name, [])
    level, words = health(deployment, model_ready(name, deployment), firing)
    live = live_versions(deployment, live_figures(name))
    services = current_services()
    slos = services.history.slo_status([s for s in services.slos if s.model == name], datetime.now(UTC))
    return page(
        "console/model.html",
        name=name,
        level=level,
        health=words,
        versions=versions,
        deployment=deployment,
        live=live,
        active=active,
        last_rollout=last_rollout,
        rollback=_rollback_plan(db, name) if deployment else {"possible": False, "why": "not deployed"},
        undeploy=undeploy_words(name, live, len(versions)) if deployment else None,
        first_deploy=first_deploy_words(name),
        alerts=firing,
        slos=slos,
        refresh_s=MODEL_REFRESH_S,
        defaults=current_services().settings.rollout,
    )
