#!/usr/bin/env python3
"""Test runbook: four steps; 'optional' always fails (continue), 'needs_marker' fails (stop) until a file exists."""

import os
import sys

from _runbook import Context, StepFailed, main

RUNBOOK = {
    "name": "steps",
    "description": "Multi-step behaviour: continue past one failure, stop at another, resume.",
    "params": {"marker": {"type": "str", "required": True}},
    "role": "operator",
    "timeout_s": 30,
    "automatic": False,
    "dangerous": False,
    "steps": [
        {"name": "first", "on_failure": "stop"},
        {"name": "optional", "on_failure": "continue"},
        {"name": "needs_marker", "on_failure": "stop"},
        {"name": "last", "on_failure": "stop"},
    ],
}


def first(ctx: Context) -> str:
    return "first done"


def optional(ctx: Context) -> str:
    raise StepFailed("optional step failed, carrying on")


def needs_marker(ctx: Context) -> str:
    if not os.path.exists(ctx.params["marker"]):
        raise StepFailed(f"{ctx.params['marker']} is missing")
    return "marker found"


def last(ctx: Context) -> str:
    return "last done"


if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {"first": first, "optional": optional, "needs_marker": needs_marker, "last": last}))
