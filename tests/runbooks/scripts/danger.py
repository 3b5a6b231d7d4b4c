#!/usr/bin/env python3
"""Test runbook: dangerous (two-person rule) but allowed to run automatically from an alert."""

import sys

from _runbook import Context, main

RUNBOOK = {
    "name": "danger",
    "description": "A dangerous change to one model.",
    "params": {"model": {"type": "str", "required": True, "pattern": "[a-z0-9]+"}},
    "role": "operator",
    "timeout_s": 30,
    "automatic": True,
    "dangerous": True,
    "steps": [{"name": "change", "on_failure": "stop"}],
}


def change(ctx: Context) -> str:
    return f"changed {ctx.params['model']}"


if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {"change": change}))
