#!/usr/bin/env python3
"""Compact memory in every serving process: shrink ONNX Runtime's arenas and give free heap back.

Each gunicorn worker has its own engine, so this writes desired state ("compaction requested at
generation N", POST /api/engine/compact) that every process's reconciler acts on, then waits
until each has reported it.
"""

from __future__ import annotations

import sys

from _engine import COMPACT, wait_applied
from _runbook import Context, main

RUNBOOK = {
    "name": "compact_memory",
    "description": "Shrink ONNX Runtime's memory arenas and return free heap to the OS in every serving process.",
    "params": {},
    "role": "operator",
    "timeout_s": 120,
    "automatic": True,
    "dangerous": False,
    "steps": [
        {"name": "check", "on_failure": "stop"},
        {"name": "request", "on_failure": "stop"},
        {"name": "confirm", "on_failure": "stop"},
    ],
}


def check(ctx: Context) -> str:
    ctx.require("POST", COMPACT)
    return f"the server offers POST {COMPACT}"


def request(ctx: Context) -> str | None:
    result = ctx.post(COMPACT)
    ctx.state["compact_generation"] = result.get("compact_generation")
    if ctx.dry_run:
        return None
    return f"compaction requested at generation {result.get('compact_generation')}"


def confirm(ctx: Context) -> dict | None:
    return wait_applied(ctx, "compact_generation", ctx.state.get("compact_generation"), "compact memory")


STEPS = {"check": check, "request": request, "confirm": confirm}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
