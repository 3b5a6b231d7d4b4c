#!/usr/bin/env python3
"""Test runbook: blocks on a named pipe until the test writes to it (one run at a time per target)."""

import sys

from _runbook import Context, main

RUNBOOK = {
    "name": "hold",
    "description": "Hold a model until the test opens the gate.",
    "params": {
        "model": {"type": "str", "required": True, "pattern": "[a-z0-9]+"},
        "gate": {"type": "str", "required": True, "help": "a named pipe to read"},
    },
    "role": "operator",
    "timeout_s": 60,
    "automatic": True,
    "dangerous": False,
    "steps": [{"name": "wait", "on_failure": "stop"}],
}


def wait(ctx: Context) -> str | None:
    if ctx.dry_run:
        return None
    with open(ctx.params["gate"]) as gate:  # blocks until a writer opens the pipe
        return f"gate said {gate.read().strip()}"


if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {"wait": wait}))
