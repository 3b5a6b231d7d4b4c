#!/usr/bin/env python3
"""Test runbook: reports its argument as it arrived and what its environment holds (never the token)."""

import os
import sys

from _runbook import Context, main

RUNBOOK = {
    "name": "echo",
    "description": "Echo a text argument, repeated.",
    "params": {
        "text": {"type": "str", "required": True},
        "repeat": {"type": "int", "default": 1, "min": 1, "max": 100000},
    },
    "role": "viewer",
    "timeout_s": 30,
    "automatic": True,
    "dangerous": False,
    "steps": [{"name": "echo", "on_failure": "stop"}],
}


def echo(ctx: Context) -> dict:
    for _ in range(ctx.params["repeat"] - 1):
        print(ctx.params["text"])
    return {
        "text": ctx.params["text"],
        "argv": sys.argv[1:],
        "env": sorted(os.environ),
        "has_token": bool(os.environ.get("FLIGHTDECK_TOKEN")),
        "cwd": os.getcwd(),
    }


if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {"echo": echo}))
