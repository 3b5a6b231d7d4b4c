"""Shared by the runbooks that change the engine's desired state (batching limits, memory compaction).

Each gunicorn worker has its own engine, so these go through desired state the reconcilers apply:
PUT /api/engine/batching and POST /api/engine/compact write it, GET /api/engine/desired shows it
with what every serving process last applied.
"""

from __future__ import annotations

from typing import Any

from _runbook import Context, StepFailed

DESIRED = "/api/engine/desired"
BATCHING = "/api/engine/batching"
COMPACT = "/api/engine/compact"


def _applied(desired: dict[str, Any], key: str, target: int, what: str) -> dict[str, Any] | None:
    processes = desired["processes"]
    failed = [p for p in processes if p[key] >= target and p.get("error")]
    if failed:
        raise StepFailed(f"{failed[0]['process']} could not {what}: {failed[0]['error']}")
    if not processes or any(p[key] < target for p in processes):
        return None
    return {
        "summary": f"{len(processes)} serving process(es) applied {key} {target}",
        "processes": [{"process": p["process"], "report": p.get("report")} for p in processes],
    }


def wait_applied(ctx: Context, key: str, target: int | None, what: str) -> dict[str, Any] | None:
    """Wait until every serving process reports `key` >= `target` (default: the current desired value)."""

    def check() -> dict[str, Any] | None:
        desired = ctx.get(DESIRED)
        return _applied(desired, key, desired[key] if target is None else target, what)

    return ctx.wait_for(f"every serving process has applied the change ({what})", check)
