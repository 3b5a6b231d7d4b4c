"""Engine-wide desired state: the one `engine_desired` row (batching limits, memory compaction requests).

Every write bumps a generation in the caller's transaction, with its audit event; each serving
process's reconciler (`rollout.reconciler`) applies a new generation and reports what it applied in
`engine_status`, which `engine_processes` reads back. Per-model desired state is `rollout.service`'s.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from controlplane.clock import utcnow
from controlplane.models import EngineDesired, EngineStatus
from controlplane.rollout.service import Audit

BATCHING_LIMITS = ("max_batch_size", "max_queue_delay_ms", "max_queue_size")
HEARD_FROM_S = 60.0  # a process whose engine_status is older than this is taken to be gone


def engine_desired(session: Session, now: datetime | None = None) -> EngineDesired:
    """Return the engine-wide desired state (its one row), creating it if the database lacks it."""
    desired = session.get(EngineDesired, 1)
    if desired is None:
        desired = EngineDesired(id=1, generation=1, compact_generation=0, updated_at=now or utcnow(), updated_by="")
        session.add(desired)
        session.flush()
    return desired


def effective_batching(desired: EngineDesired, own: dict[str, Any]) -> dict[str, Any]:
    """The limits in force: the desired ones, each null one replaced by `own` (a process's settings)."""
    return {key: own[key] if getattr(desired, key) is None else getattr(desired, key) for key in BATCHING_LIMITS}


def _bump_engine(session: Session, actor: str, now: datetime, counter: str, **changes: Any) -> EngineDesired:
    # NOTE: one UPDATE adding 1 in the database, so two writers at once never hand out the same generation.
    engine_desired(session, now)
    column = getattr(EngineDesired, counter)
    session.execute(
        update(EngineDesired)
        .where(EngineDesired.id == 1)
        .values({counter: column + 1, "updated_at": now, "updated_by": actor[:128], **changes})
        .execution_options(synchronize_session=False)
    )
    return session.get(EngineDesired, 1, populate_existing=True)


def set_engine_batching(
    session: Session,
    changes: dict[str, int | float | None],
    actor: str,
    audit: Audit,
    own: dict[str, Any],
    now: datetime | None = None,
) -> dict[str, Any]:
    """Write new batching limits for every process (generation bumped); return the generation and limits in force."""
    desired = _bump_engine(session, actor, now or utcnow(), "generation", **changes)
    result = {"generation": desired.generation, "batching": effective_batching(desired, own)}
    audit(session, "engine.batching", "engine", "ok", {"changes": changes, **result})
    return result


def request_compaction(session: Session, actor: str, audit: Audit, now: datetime | None = None) -> dict[str, int]:
    """Ask every process to compact its memory once (compact_generation bumped)."""
    desired = _bump_engine(session, actor, now or utcnow(), "compact_generation")
    result = {"compact_generation": desired.compact_generation}
    audit(session, "engine.compact", "engine", "ok", result)
    return result


def engine_processes(
    session: Session, now: datetime | None = None, heard_from_s: float = HEARD_FROM_S
) -> list[EngineStatus]:
    """The engine_status rows of processes heard from in the last `heard_from_s` seconds (the live ones)."""
    since = (now or utcnow()) - timedelta(seconds=heard_from_s)
    return list(
        session.scalars(select(EngineStatus).where(EngineStatus.updated_at >= since).order_by(EngineStatus.process))
    )
