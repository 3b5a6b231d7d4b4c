"""The overview (every model at a glance) and a model's page (versions, slots, rollout, actions, charts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.alerting.api import alert_json
from controlplane.console.base import bp, login_required, page, services
from controlplane.db import get_db
from controlplane.errors import ApiError, NotFound
from controlplane.models import AlertRecord, Deployment
from controlplane.registry.service import Registry, version_dict
from controlplane.rollout import service as rollouts
from controlplane.rollout.api import ACTIONS, describe_deployment, describe_rollout
from controlplane.rollout.states import ACTIVE, RolloutState, allowed_events

FIGURES_WINDOW = timedelta(minutes=5)  # the overview's rate, p99 and error rate are over this window
OVERVIEW_REFRESH_S = 5
MODEL_REFRESH_S = 3


def _model_names(db: Session) -> list[str]:
    deployed = set(db.scalars(select(Deployment.model)))
    return sorted(deployed | set(services().engine.models()))


def firing_by_model(db: Session) -> dict[str, list[dict[str, Any]]]:
    """Return the firing alerts by their model label, most severe first."""
    found: dict[str, list[dict[str, Any]]] = {}
    rows = db.scalars(select(AlertRecord).where(AlertRecord.state == "firing"))
    for row in sorted(rows, key=lambda r: (r.severity, r.rule)):
        found.setdefault(row.labels.get("model", ""), []).append(alert_json(row))
    return found


def live_figures(model: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """Return rate, p99 and error rate per (model, version) over the last few minutes."""
    now = datetime.now(UTC)
    rows = services().history.summary(now - FIGURES_WINDOW, now, model)
    return {(r["model"], r["version"]): r for r in rows}


def health(deployment: dict[str, Any] | None, ready: bool, firing: list[dict[str, Any]]) -> tuple[str, str]:
    """Return (level, words) for a model: not served, starting, failing, degraded, rolling out or healthy."""
    if deployment is None:
        return "idle", "not served"
    failed = [p for p in deployment["processes"] if p["state"] == "failed"]
    if not ready:
        if failed:
            return "failing", f"not ready: {failed[0]['error'] or 'its load failed'}"
        if not loaded_somewhere(deployment):
            # NOTE: a first deploy: no process has loaded and checked it yet.
            return "rolling", "starting: waiting for the serving processes to load it and pass its golden samples"
        return "failing", "not ready"
    if any(a["severity"] == "P0" for a in firing):
        return "failing", "P0 alert firing"
    if failed:
        return "degraded", f"{len(failed)} slot load(s) failed"
    if firing:
        return "degraded", f"{len(firing)} alert(s) firing"
    active = [r for r in deployment["rollouts"] if r["state"] in ACTIVE]
    if active:
        return "rolling", f"rolling out v{active[0]['to_version']} ({active[0]['state']})"
    return "healthy", "healthy"


def model_ready(name: str, deployment: dict[str, Any] | None) -> bool:
    """Return whether `name` is ready here, or where this process does not load it, whether any process serves it."""
    engine = services().engine
    if name in engine.models():
        return engine.model_ready(name)
    # NOTE: not loaded here (a first deploy under way, or a node that does not serve it): go by the reports.
    return deployment is not None and loaded_somewhere(deployment)


def loaded_somewhere(deployment: dict[str, Any]) -> bool:
    """Return whether any serving process reports a version of this deployment loaded."""
    return any(p["state"] == "loaded" and p["version"] for p in deployment["processes"])


def live_versions(deployment: dict[str, Any] | None, figures: dict[tuple[str, str], dict]) -> list[dict[str, Any]]:
    """Return the versions a deployment's slots hold, with their traffic and figures, most traffic first."""
    if deployment is None:
        return []
    live = []
    for slot, info in deployment["slots"].items():
        if info["version"] is None:
            continue
        shown = figures.get((deployment["model"], info["version"]), {})
        live.append({"slot": slot, "version": info["version"], "weight": info["weight"], "stable": slot == deployment["stable_slot"], **{k: shown.get(k) for k in ("throughput", "p99", "error_rate", "requests")}})  # fmt: skip
    return sorted(live, key=lambda v: -v["weight"])


@bp.get("/")
@login_required
def overview() -> Response:
    """Every model's health, live versions and split, rate, p99, error rate, and the firing alerts."""
    db = get_db()
    engine = services().engine
    firing = firing_by_model(db)
    figures = live_figures()
    models = []
    for name in _model_names(db):
        deployment = describe_deployment(db, name)
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
    )


def model_versions(name: str) -> list[dict[str, Any]]:
    """Return the registry's versions of a model, in the order they were pushed."""
    registry = Registry.for_settings(services().sessions, services().settings)
    return [version_dict(row) for row in registry.list(name)]


def undeploy_words(name: str, live: list[dict[str, Any]], versions: int) -> str:
    """Say exactly what undeploying `name` does (shown beside the button and in its confirmation)."""
    held = []
    for v in live:
        traffic = f"{v['weight']}% of traffic" if v["weight"] else "no traffic"
        held.append(f"v{v['version']} ({v['slot']}, {traffic})")
    kept = f"its {versions} version{'s stay' if versions != 1 else ' stays'}" if versions else "its versions stay"
    return (
        f"Every serving process unloads {', '.join(held) or 'its slots'}, and inference requests for {name} "
        f"get 404 until someone deploys it again. Nothing is deleted: {kept} in the registry."
    )


def first_deploy_words(name: str) -> str:
    """Say what a first deploy of `name` does; `{version}` is the chosen version, filled in by console.js."""
    return (
        f"Start serving {name} version {{version}}? Every serving process loads it and checks its golden "
        f"samples; then it takes all of {name}'s traffic."
    )


def _rollback_plan(db: Session, name: str) -> dict[str, Any]:
    try:
        plan = rollouts.plan_rollback(db, name, services().settings.rollout)
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
    deployment = describe_deployment(db, name)
    if deployment is None and not versions:
        raise NotFound(f"no model named {name!r}")
    active = None
    if deployment:
        current = next((r for r in deployment["rollouts"] if r["state"] in ACTIVE), None)
        if current is not None:
            active = describe_rollout(db, current["id"])
            events = allowed_events(RolloutState(current["state"]))
            active["actions"] = [a for a in ACTIONS if a in events]
    firing = firing_by_model(db).get(name, [])
    level, words = health(deployment, model_ready(name, deployment), firing)
    live = live_versions(deployment, live_figures(name))
    return page(
        "console/model.html",
        name=name,
        level=level,
        health=words,
        versions=versions,
        deployment=deployment,
        live=live,
        active=active,
        rollback=_rollback_plan(db, name) if deployment else {"possible": False, "why": "not deployed"},
        undeploy=undeploy_words(name, live, len(versions)) if deployment else None,
        first_deploy=first_deploy_words(name),
        alerts=firing,
        refresh_s=MODEL_REFRESH_S,
        defaults=services().settings.rollout,
    )
