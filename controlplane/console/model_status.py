"""What the model pages show: each model's health, readiness, live versions with their figures, its
registry versions, firing alerts by model, and the words of the Start and Stop serving confirmations.

Readers shared by the overview, the model page and the Models page (`model_pages`, `registry_pages`),
so that no page module imports another.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.alerting.readmodel import alert_json
from controlplane.context import current_services
from controlplane.models import AlertRecord
from controlplane.registry.service import version_dict
from controlplane.rollout.states import ACTIVE

FIGURES_WINDOW = timedelta(minutes=5)  # the overview's rate, p99 and error rate are over this window


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
    rows = current_services().history.summary(now - FIGURES_WINDOW, now, model)
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
    engine = current_services().engine
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


def model_versions(name: str) -> list[dict[str, Any]]:
    """Return the registry's versions of a model, in the order they were pushed."""
    registry = current_services().registry
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
