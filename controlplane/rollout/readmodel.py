"""How deployments and rollouts are shown: the rollout API, the console and the CLI read these.

Pure readers over a session; the writes are in `rollout.service` and `rollout.deployments`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.clock import utcnow
from controlplane.cluster import Liveness, heartbeats, is_alive, node_of
from controlplane.models import Deployment, Rollout, RolloutMeasurement, SlotStatus
from controlplane.rollout.states import Slot

# What a person may do to a rollout: POST /api/rollouts/<id>/<action>.
RolloutAction = Literal["promote", "promote_all", "pause", "resume", "abort"]
ACTIONS: tuple[str, ...] = get_args(RolloutAction)


__all__ = ["ACTIONS", "RolloutAction", "describe_deployment", "describe_rollout", "node_of", "rollout_json"]


def rollout_json(rollout: Rollout, measurements: list[RolloutMeasurement] | None = None) -> dict[str, Any]:
    """Describe a rollout, with its step analyses when given."""
    data = {
        "id": rollout.id,
        "model": rollout.model,
        "from_version": rollout.from_version,
        "to_version": rollout.to_version,
        "candidate_slot": rollout.candidate_slot,
        "strategy": rollout.strategy,
        "steps": rollout.steps,
        "step_index": rollout.step_index,
        "traffic_percent": rollout.steps[rollout.step_index] if rollout.state != "loading" else 0,
        "pause_s": rollout.pause_s,
        "shadow": rollout.shadow,
        "policy": rollout.policy,
        "state": rollout.state,
        "reason": rollout.reason,
        "created_by": rollout.created_by,
        "created_at": rollout.created_at.isoformat(),
        "updated_at": rollout.updated_at.isoformat(),
        "finished_at": rollout.finished_at.isoformat() if rollout.finished_at else None,
    }
    if measurements is not None:
        data["measurements"] = [
            {
                "step_index": m.step_index,
                "ts": m.ts.isoformat(),
                "verdict": m.verdict,
                "reasons": m.reasons,
                "figures": m.figures,
                "evidence": m.evidence or [],
            }
            for m in measurements
        ]
    return data


def describe_deployment(
    session: Session, name: str, liveness: Liveness | None = None, now: datetime | None = None
) -> dict[str, Any] | None:
    """Return a model's desired slots, what each process reports and its latest rollouts; None if undeployed.

    A process that stopped sending heartbeats (see `controlplane.cluster`) is listed with state `gone`
    (what it last reported stays in `reported_state`), never as still serving.
    """
    desired = session.get(Deployment, name)
    if desired is None:
        return None
    liveness, now = liveness or Liveness(), now or utcnow()
    beats = heartbeats(session)
    statuses = session.scalars(select(SlotStatus).where(SlotStatus.model == name).order_by(SlotStatus.process))
    rollouts = session.scalars(select(Rollout).where(Rollout.model == name).order_by(Rollout.id.desc()).limit(10))
    processes = []
    for s in sorted(statuses, key=lambda s: (node_of(s.process), s.process)):  # grouped by node
        last = beats.get(s.process)
        alive = is_alive(last, now, liveness)
        processes.append(
            {"process": s.process, "node": node_of(s.process), "slot": s.slot, "version": s.version,
             "state": s.state if alive else "gone", "reported_state": s.state, "alive": alive,
             "last_heartbeat": last.isoformat() if last else None, "error": s.error, "generation": s.generation,
             "updated_at": s.updated_at.isoformat()}
        )  # fmt: skip
    return {
        "model": name,
        "slots": {slot: {"version": desired.version_in(slot), "weight": desired.weights()[slot]} for slot in Slot},
        "stable_slot": desired.stable_slot,
        "generation": desired.generation,
        "processes": processes,
        "rollouts": [rollout_json(r) for r in rollouts],
    }


def describe_rollout(session: Session, rollout_id: int) -> dict[str, Any] | None:
    """Return a rollout with every step's analysis, or None if there is no such rollout."""
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        return None
    measurements = session.scalars(
        select(RolloutMeasurement).where(RolloutMeasurement.rollout_id == rollout_id).order_by(RolloutMeasurement.id)
    )
    return rollout_json(rollout, list(measurements))
