#!/usr/bin/env python3
"""Collect a diagnostic snapshot into one JSON file: engine and GPU state, queues, recent errors and deploys.

Each part is fetched on its own, so one the server cannot answer is recorded as an error and the
rest are still written. The file goes to FLIGHTDECK_OUTPUT_DIR (default: the current directory).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from _runbook import Context, StepFailed, main

GPU_PREFIX = "flightdeck_gpu_"
RUNBOOK = {
    "name": "diagnostics",
    "description": "Write a snapshot (engine, GPU and queue state, last hour's figures, recent errors and deploys).",
    "params": {
        "out": {
            "type": "str",
            "required": False,
            "pattern": r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}\.json",
            "help": "file name, written in FLIGHTDECK_OUTPUT_DIR (default: diagnostics-<UTC time>.json)",
        }
    },
    "role": "viewer",
    "timeout_s": 60,
    "automatic": True,
    "dangerous": False,
    "steps": [
        {"name": "engine", "on_failure": "continue"},
        {"name": "metrics", "on_failure": "continue"},
        {"name": "history", "on_failure": "continue"},
        {"name": "deploys", "on_failure": "continue"},
        {"name": "errors", "on_failure": "continue"},
        {"name": "write", "on_failure": "stop"},
    ],
}


def _keep(ctx: Context, part: str, fetch) -> str | None:
    try:
        ctx.state[part] = fetch()
    except StepFailed as exc:
        ctx.state[part] = {"error": str(exc)}
        raise
    return None if ctx.dry_run else f"{part}: fetched"


def engine(ctx: Context) -> str | None:
    """What this process serves: slots, versions, providers, weights, queue depths."""
    return _keep(ctx, "engine", lambda: ctx.get("/api/engine"))


def metrics(ctx: Context) -> str | None:
    """The Prometheus exposition, with the GPU lines picked out."""

    def fetch() -> dict:
        text = ctx.text("/metrics")
        return {"gpu": [line for line in text.splitlines() if line.startswith(GPU_PREFIX)], "exposition": text}

    return _keep(ctx, "metrics", fetch)


def history(ctx: Context) -> str | None:
    """Last hour's figures per model/version/slot (error, timeout, rejection rates, latency)."""
    return _keep(ctx, "history", lambda: ctx.get("/api/history/summary", {"start": "-1h"}))


def deploys(ctx: Context) -> str | None:
    """The last 20 rollout events."""
    return _keep(ctx, "deploys", lambda: ctx.get("/api/audit", {"action": "rollout.*", "limit": "20"}))


def errors(ctx: Context) -> str | None:
    """The last 20 actions that ended in error."""
    return _keep(ctx, "errors", lambda: ctx.get("/api/audit", {"outcome": "error", "limit": "20"}))


def write(ctx: Context) -> str | None:
    taken = datetime.now(UTC)
    name = ctx.params.get("out") or f"diagnostics-{taken:%Y%m%dT%H%M%SZ}.json"
    snapshot = {"taken_at": taken.isoformat(), "server": ctx.url, **ctx.state}
    path = ctx.write_json(name, snapshot)
    missing = sorted(part for part, value in ctx.state.items() if isinstance(value, dict) and "error" in value)
    return None if ctx.dry_run else f"wrote {path}" + (f" (could not fetch: {', '.join(missing)})" if missing else "")


STEPS = {"engine": engine, "metrics": metrics, "history": history, "deploys": deploys, "errors": errors, "write": write}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
