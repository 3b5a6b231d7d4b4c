#!/usr/bin/env python3
"""Drain one slot of a model and load its version again, in every serving process.

For a slot whose session misbehaves (memory, a stuck provider): its traffic moves to the other slot,
its queue empties, the version is unloaded, loaded and checked against its golden samples again, and
traffic comes back. Needs POST /api/models/{name}/slots/{slot}/reload on the server.
"""

from __future__ import annotations

import sys
from typing import Any

from _runbook import MODEL_NAME, Context, StepFailed, main

ENDPOINT = "/api/models/{name}/slots/{slot}/reload"
RUNBOOK = {
    "name": "drain_reload",
    "description": "Drain one slot of a model, unload it, load and verify the same version again, restore traffic.",
    "params": {
        "model": {"type": "str", "required": True, "pattern": MODEL_NAME, "help": "model, e.g. textcls"},
        "slot": {"type": "str", "required": True, "choices": ["blue", "green"], "help": "slot to reload"},
    },
    "role": "operator",
    "timeout_s": 300,
    "automatic": False,
    "dangerous": True,
    "steps": [
        {"name": "check", "on_failure": "stop"},
        {"name": "reload", "on_failure": "stop"},
        {"name": "verify", "on_failure": "stop"},
    ],
}


def check(ctx: Context) -> str | None:
    model, slot = ctx.params["model"], ctx.params["slot"]
    ctx.require("POST", ENDPOINT)
    deployment = ctx.get(f"/api/models/{model}/deployment")
    if ctx.dry_run:
        return None
    other = "green" if slot == "blue" else "blue"
    mine, theirs = deployment["slots"][slot], deployment["slots"][other]
    if mine["version"] is None:
        raise StepFailed(f"{model} has nothing in {slot} to reload")
    if mine["weight"] > 0 and theirs["version"] is None:
        raise StepFailed(
            f"{slot} takes {mine['weight']}% of {model}'s traffic and {other} is empty: nothing would serve "
            "while it reloads; deploy a version into the other slot first"
        )
    return f"{slot} holds version {mine['version']} ({mine['weight']}% of traffic); {other} holds {theirs['version']}"


def reload(ctx: Context) -> str | None:
    model, slot = ctx.params["model"], ctx.params["slot"]
    result = ctx.post(f"/api/models/{model}/slots/{slot}/reload")
    ctx.state["generation"] = result.get("generation")
    if ctx.dry_run:
        return None
    return f"{model} {slot} (version {result.get('version')}) reloads at generation {result.get('generation')}"


def _reloaded(deployment: dict[str, Any], live: set[str], slot: str, generation: int) -> str | None:
    """Say done only when every live serving process reports the slot loaded at the reload's generation."""
    rows = [p for p in deployment["processes"] if p["slot"] == slot and p["generation"] >= generation]
    failed = [p for p in rows if p["state"] == "failed"]
    if failed:
        raise StepFailed(f"{failed[0]['process']} could not reload {slot}: {failed[0]['error']}")
    done = {p["process"] for p in rows if p["state"] == "loaded"}
    if not rows or not live <= done:
        return None
    return f"{len(done)} process(es) reloaded {slot} (version {rows[0]['version']}) and verified it"


def verify(ctx: Context) -> str | None:
    model, slot = ctx.params["model"], ctx.params["slot"]

    def reloaded() -> str | None:
        deployment = ctx.get(f"/api/models/{model}/deployment")
        try:
            live = {p["process"] for p in ctx.get("/api/engine/desired").get("processes", [])}
        except StepFailed:  # a server without the engine status list: judge by the slot rows alone
            live = set()
        return _reloaded(deployment, live, slot, ctx.state.get("generation") or deployment["generation"])

    return ctx.wait_for(f"every process has reloaded {model} {slot}", reloaded)


STEPS = {"check": check, "reload": reload, "verify": verify}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
