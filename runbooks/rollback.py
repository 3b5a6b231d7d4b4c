#!/usr/bin/env python3
"""Roll a model back: traffic returns to its last stable version, then wait until the processes serve it."""

from __future__ import annotations

import sys
from typing import Any

from _runbook import MODEL_NAME, Context, StepFailed, main

RUNBOOK = {
    "name": "rollback",
    "description": "Return a model's traffic to its last stable version (reloading it first if it was scaled down).",
    "params": {"model": {"type": "str", "required": True, "pattern": MODEL_NAME, "help": "model, e.g. textcls"}},
    "role": "operator",
    "timeout_s": 120,
    "automatic": True,
    "dangerous": False,
    "steps": [{"name": "rollback", "on_failure": "stop"}, {"name": "verify", "on_failure": "stop"}],
}


def rollback(ctx: Context) -> str | None:
    result = ctx.post(f"/api/models/{ctx.params['model']}/rollback")
    ctx.state["version"] = result.get("version")
    if ctx.dry_run:
        return None
    how = "once it is loaded and verified" if result.get("reloaded") else "at once"
    return f"traffic returns to version {result.get('version')} {how} (rollout {result.get('rollout')})"


def _served(deployment: dict[str, Any], version: str | None) -> str | None:
    """Return what serves all traffic once the processes that applied this generation serve `version`, else None."""
    stable = deployment["stable_slot"]
    slot = deployment["slots"][stable]
    if slot["weight"] != 100 or (version is not None and slot["version"] != version):
        return None
    rows = [p for p in deployment["processes"] if p["slot"] == stable]
    failed = [p for p in rows if p["state"] == "failed"]
    if failed:
        raise StepFailed(f"{failed[0]['process']} could not load version {slot['version']}: {failed[0]['error']}")
    current = [p for p in rows if p["generation"] >= deployment["generation"]]
    if not current or any(p["state"] != "loaded" or p["version"] != slot["version"] for p in current):
        return None
    lagging = len(rows) - len(current)
    behind = f"; {lagging} process(es) have not reported since (stopped, or still converging)" if lagging else ""
    return f"{len(current)} process(es) serve version {slot['version']} from {stable} with all traffic{behind}"


def verify(ctx: Context) -> str | None:
    model = ctx.params["model"]
    version = ctx.state.get("version")  # None when resumed here: then any converged stable version will do
    return ctx.wait_for(
        f"{model} serves version {version} everywhere" if version else f"{model} serves its stable version everywhere",
        lambda: _served(ctx.get(f"/api/models/{model}/deployment"), version),
    )


STEPS = {"rollback": rollback, "verify": verify}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
