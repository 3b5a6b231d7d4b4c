#!/usr/bin/env python3
"""Test runbook: blocks on a named pipe nobody writes to, past its one-second timeout."""

import sys

from _runbook import Context, main

RUNBOOK = {
    "name": "stuck",
    "description": "Never finishes by itself.",
    "params": {"gate": {"type": "str", "required": True}},
    "role": "operator",
    "timeout_s": 1,
    "automatic": False,
    "dangerous": False,
    "steps": [{"name": "started", "on_failure": "stop"}, {"name": "wait", "on_failure": "stop"}],
}


def started(ctx: Context) -> str:
    return "about to block"


def wait(ctx: Context) -> str:
    with open(ctx.params["gate"]) as gate:
        return gate.read()


if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {"started": started, "wait": wait}))
