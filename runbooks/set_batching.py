#!/usr/bin/env python3
"""Change the dynamic batching limits of every serving process (largest batch, longest wait for one)."""

from __future__ import annotations

import sys

from _engine import BATCHING, wait_applied
from _runbook import Context, main

RUNBOOK = {
    "name": "set_batching",
    "description": "Set the largest batch and the longest queue delay for every loaded version, in every process.",
    "params": {
        "max_batch_size": {"type": "int", "required": True, "min": 1, "max": 1024, "help": "largest batch formed"},
        "max_queue_delay_ms": {
            "type": "float",
            "required": True,
            "min": 0,
            "max": 1000,
            "help": "longest a request waits for a batch to fill while the engine is busy",
        },
    },
    "role": "operator",
    "timeout_s": 60,
    "automatic": False,
    "dangerous": False,
    "steps": [
        {"name": "check", "on_failure": "stop"},
        {"name": "apply", "on_failure": "stop"},
        {"name": "confirm", "on_failure": "stop"},
    ],
}


def check(ctx: Context) -> str:
    ctx.require("PUT", BATCHING)
    return f"the server offers PUT {BATCHING}"


def apply(ctx: Context) -> str | None:
    body = {k: ctx.params[k] for k in ("max_batch_size", "max_queue_delay_ms")}
    result = ctx.put(BATCHING, body)
    ctx.state["generation"] = result.get("generation")
    if ctx.dry_run:
        return None
    return f"batching is now {result.get('batching')} (generation {result.get('generation')})"


def confirm(ctx: Context) -> dict | None:
    return wait_applied(ctx, "generation", ctx.state.get("generation"), "change its batching limits")


STEPS = {"check": check, "apply": apply, "confirm": confirm}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
