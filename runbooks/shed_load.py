#!/usr/bin/env python3
"""Shed load: lower the queue limit, so excess requests are refused at once (429) instead of timing out."""

from __future__ import annotations

import sys

from _engine import BATCHING, DESIRED, wait_applied
from _runbook import Context, StepFailed, main

RUNBOOK = {
    "name": "shed_load",
    "description": "Lower the per-version queue limit in every serving process; the excess is refused with 429.",
    "params": {
        "max_queue_size": {
            "type": "int",
            "required": False,
            "min": 1,
            "max": 1000000,
            "help": "new queue limit in samples (default: half the current one); must be lower than now",
        },
    },
    "role": "operator",
    "timeout_s": 60,
    "automatic": True,
    "dangerous": False,
    "steps": [
        {"name": "check", "on_failure": "stop"},
        {"name": "apply", "on_failure": "stop"},
        {"name": "confirm", "on_failure": "stop"},
    ],
}


def _limits(ctx: Context) -> tuple[int, int]:
    """Return (current limit, new limit); the new one must be lower."""
    current = int(ctx.get(DESIRED)["batching"]["max_queue_size"])
    wanted = ctx.params.get("max_queue_size") or max(1, current // 2)
    if wanted >= current:
        raise StepFailed(f"the queue limit is {current}; {wanted} would not shed load (use set_batching to raise it)")
    return current, wanted


def check(ctx: Context) -> str | None:
    ctx.require("PUT", BATCHING)
    if ctx.dry_run:
        ctx.get(DESIRED)
        return None
    current, wanted = _limits(ctx)
    return f"the queue limit goes from {current} to {wanted} samples per loaded version"


def apply(ctx: Context) -> str | None:
    if ctx.dry_run:
        wanted = ctx.params.get("max_queue_size", "half the current limit")
        ctx.put(BATCHING, {"max_queue_size": wanted})
        return None
    current, wanted = _limits(ctx)
    result = ctx.put(BATCHING, {"max_queue_size": wanted})
    ctx.state["generation"] = result.get("generation")
    return f"queue limit {current} -> {wanted} (generation {result.get('generation')})"


def confirm(ctx: Context) -> dict | None:
    return wait_applied(ctx, "generation", ctx.state.get("generation"), "lower its queue limit")


STEPS = {"check": check, "apply": apply, "confirm": confirm}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
