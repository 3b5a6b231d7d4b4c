"""Which models are served: creating a model's desired state (its first deploy) and removing it (undeploy).

The `deployments` table is the served set. Every serving process's reconciler loads what a row
names and unloads a model whose row is gone, so a restart serves exactly what is stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.clock import utcnow
from controlplane.errors import Conflict, NotFound
from controlplane.models import Deployment, SlotStatus
from controlplane.rollout.service import Audit, active_rollout
from controlplane.rollout.states import Slot
from controlplane.tracing import traced


def ensure_deployments(
    session: Session, first_versions: dict[str, str], now: datetime | None = None, audit: Audit | None = None
) -> list[str]:
    """Give every model without desired state one: its given version in blue, all traffic. Return those created."""
    now = now or utcnow()
    existing = set(session.scalars(select(Deployment.model)))
    created = []
    for model, version in first_versions.items():
        if model not in existing:
            session.add(Deployment(model=model, blue_version=version, blue_weight=100, green_weight=0, updated_at=now))
            created.append(model)
            if audit is not None:
                audit(session, "model.deploy", f"{model}:{version}", "ok", {"version": version, "first": True})
    return created


@traced("rollout.first_deploy", "model", "version")
def first_deploy(session: Session, model: str, version: str, audit: Audit, now: datetime | None = None) -> Deployment:
    """Start serving a model that has no deployment: `version` in blue with all of its traffic.

    There is no stable version to compare a canary with, so, as Triton's model load does, each
    process serves it as soon as it has loaded it and it passed its golden samples; a process where
    it fails reports why in slot_status and serves nothing for it.
    """
    if session.get(Deployment, model) is not None:
        raise Conflict(f"model '{model}' is already deployed; deploy a new version to roll it out")
    now = now or utcnow()
    # NOTE: rows a process reported for an earlier deployment of this name would read as this one's.
    session.execute(delete(SlotStatus).where(SlotStatus.model == model))
    deployment = Deployment(model=model, blue_version=version, blue_weight=100, green_weight=0, updated_at=now)
    session.add(deployment)
    try:
        session.flush()
    except IntegrityError:  # another first deploy of the same model won the race
        raise Conflict(f"model '{model}' was deployed by someone else just now") from None
    audit(session, "model.deploy", f"{model}:{version}", "ok", {"version": version, "first": True})
    return deployment


@traced("rollout.undeploy", "model")
def undeploy(session: Session, model: str, audit: Audit, now: datetime | None = None) -> dict[str, Any]:
    """Stop serving a model everywhere: its desired state goes, so every process unloads it.

    Refused (Conflict) while a rollout of it is in progress: abort or roll it back first, so a
    half-done rollout never vanishes without its own record.
    """
    deployment = session.get(Deployment, model)
    if deployment is None:
        raise NotFound(f"model '{model}' is not deployed")
    rollout = active_rollout(session, model)
    if rollout is not None:
        raise Conflict(
            f"model '{model}' has rollout {rollout.id} in progress ({rollout.state}); abort or roll it back first"
        )
    versions = {slot: deployment.version_in(slot) for slot in Slot if deployment.version_in(slot)}
    session.delete(deployment)
    session.execute(delete(SlotStatus).where(SlotStatus.model == model))
    session.flush()
    result = {"model": model, "undeployed": True, "versions": versions}
    audit(session, "model.undeploy", model, "ok", result)
    return result


def deployment_json(deployment: Deployment, state: str) -> dict[str, Any]:
    """Describe a first deploy's result for the API and the CLI."""
    return {
        "model": deployment.model,
        "version": deployment.blue_version,
        "first_deploy": True,
        "generation": deployment.generation,
        "state": state,
    }
