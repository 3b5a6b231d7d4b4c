"""The cluster as an operator sees it: nodes, their serving processes (alive or gone), and who leads.

Every serving process refreshes its `engine_status` row every heartbeat (the reconciler's pass);
that row is the one sign of life. A process silent for `GONE_AFTER_HEARTBEATS` heartbeats is shown
as gone wherever processes are listed, and the leader drops the reports (`slot_status`,
`engine_status`) of one silent for `drop_after_s` (`drop_gone_processes`). A process that stops
cleanly removes its own rows at once. The lease holder and since when come from `leases`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controlplane.models import EngineStatus, Lease, SlotStatus

GONE_AFTER_HEARTBEATS = 3
SCHEDULER_LEASE = "scheduler"  # NOTE: LeaderScheduler.LEASE; kept here too so this module needs no scheduler


@dataclass(frozen=True)
class Liveness:
    """How long a process may stay silent before it is shown as gone, and before its reports are dropped."""

    heartbeat_s: float = 10.0
    drop_after_s: float = 600.0

    @property
    def gone_after_s(self) -> float:
        return GONE_AFTER_HEARTBEATS * self.heartbeat_s


def node_of(process: str) -> str:
    """Return the node a process name (NODE:PID, FLIGHTDECK_NODE) belongs to."""
    return process.rsplit(":", 1)[0]


def heartbeats(session: Session) -> dict[str, datetime]:
    """Return every reporting process's last heartbeat."""
    return {process: beat for process, beat in session.execute(select(EngineStatus.process, EngineStatus.updated_at))}


def is_alive(last_heartbeat: datetime | None, now: datetime, liveness: Liveness) -> bool:
    """Return whether a process with this last heartbeat (None: no row, it left) still counts as alive."""
    return last_heartbeat is not None and now - last_heartbeat <= timedelta(seconds=liveness.gone_after_s)


def leader(session: Session, now: datetime) -> dict[str, Any] | None:
    """Return the scheduler lease's holder (process and node), since when it holds it, and whether it is current."""
    lease = session.get(Lease, SCHEDULER_LEASE)
    if lease is None:
        return None
    process = lease.holder.rsplit(":", 1)[0]  # holder: NODE:PID:<random>
    return {
        "holder": lease.holder,
        "process": process,
        "node": node_of(process),
        "since": lease.acquired_at.isoformat(),
        "expires_at": lease.expires_at.isoformat(),
        "current": lease.expires_at > now,
    }


def describe_cluster(session: Session, now: datetime, liveness: Liveness) -> dict[str, Any]:
    """Return every node with its processes (alive or gone, last heartbeat, what each serves) and the leader."""
    lead = leader(session, now)
    lead_process = lead["process"] if lead and lead["current"] else None
    processes: dict[str, dict[str, Any]] = {}
    for row in session.scalars(select(EngineStatus)):
        processes[row.process] = _process(row.process, row, now, liveness, lead_process)
    for status in session.scalars(select(SlotStatus).order_by(SlotStatus.model, SlotStatus.slot)):
        entry = processes.setdefault(status.process, _process(status.process, None, now, liveness, lead_process))
        if status.version:
            entry["serving"].append(
                {"model": status.model, "slot": status.slot, "version": status.version, "state": status.state}
            )
    nodes: dict[str, dict[str, Any]] = {}
    for name in sorted(processes):
        entry = processes[name]
        node = nodes.setdefault(
            entry["node"], {"node": entry["node"], "alive": False, "leader": False, "processes": []}
        )
        node["processes"].append(entry)
        node["alive"] = node["alive"] or entry["alive"]
        node["leader"] = node["leader"] or entry["leader"]
    return {
        "leader": lead,
        "heartbeat_s": liveness.heartbeat_s,
        "gone_after_s": liveness.gone_after_s,
        "drop_after_s": liveness.drop_after_s,
        "nodes": [nodes[n] for n in sorted(nodes)],
    }


def _process(
    name: str, row: EngineStatus | None, now: datetime, liveness: Liveness, lead_process: str | None
) -> dict[str, Any]:
    last = row.updated_at if row is not None else None
    alive = is_alive(last, now, liveness)
    pid = name.rsplit(":", 1)[1] if ":" in name else ""
    return {
        "process": name,
        "node": node_of(name),
        "pid": int(pid) if pid.isdigit() else None,
        "alive": alive,
        "state": "alive" if alive else "gone",
        "leader": alive and name == lead_process,
        "last_heartbeat": last.isoformat() if last is not None else None,
        "started_at": row.started_at.isoformat() if row is not None and row.started_at else None,
        "flightdeck_version": row.software_version if row is not None else "",
        "serving": [],
    }


def drop_gone_processes(session: Session, now: datetime, liveness: Liveness) -> list[str]:
    """Delete the reports of processes silent for longer than `drop_after_s`; return their names. Does not commit."""
    cutoff = now - timedelta(seconds=liveness.drop_after_s)
    beats = heartbeats(session)
    reporting = set(session.scalars(select(SlotStatus.process).distinct()))
    # NOTE: slot rows of a process with no heartbeat row at all (a process of an older release, or one whose
    # row was dropped) go once their own last update is older than the cutoff.
    stale_slots = set(session.scalars(select(SlotStatus.process).where(SlotStatus.updated_at < cutoff).distinct()))
    gone = sorted(
        {p for p, beat in beats.items() if beat < cutoff} | {p for p in reporting - set(beats) if p in stale_slots}
    )
    if gone:
        session.execute(delete(SlotStatus).where(SlotStatus.process.in_(gone)))
        session.execute(delete(EngineStatus).where(EngineStatus.process.in_(gone)))
    return gone
