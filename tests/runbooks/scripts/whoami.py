#!/usr/bin/env python3
"""Test runbook: asks the server who its token says it is."""

import sys

from _runbook import Context, main

RUNBOOK = {
    "name": "whoami",
    "description": "Report the identity of the run's token.",
    "params": {},
    "role": "viewer",
    "timeout_s": 30,
    "automatic": True,
    "dangerous": False,
    "steps": [{"name": "ask", "on_failure": "stop"}],
}


def ask(ctx: Context) -> dict:
    return ctx.get("/api/session")


if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {"ask": ask}))
