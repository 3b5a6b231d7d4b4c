#!/usr/bin/env python3
"""Say what drifted for a model and what to check next: its answers, its inputs, its reference, recent deploys.

What to check, in order (the steps print each finding):
1. Which scores are high (`GET /api/models/<m>/drift`): predictions (the label mix the model answers)
   and inputs (per sampled feature: an input's column, or the mean of a sample's values).
2. Inputs and predictions both moved: callers send different data. Ask who changed what upstream:
   a new client or caller population, a preprocessing change (scaling, resizing, tokenising,
   another file type), a broken sensor or feed. The model may be right to answer differently.
3. Predictions moved but the inputs did not: the model answers differently to the same data. Was a
   version deployed or rolled back (the deploy step lists them)? Is the reference still the right one?
4. Only inputs moved: the model copes so far; watch its answers, and tell the model's owners, who may
   need to retrain on the new data.
5. The reference: by default a version's first day serving. If that day was unusual (a load test, a
   launch), pin a normal window (`PUT /api/models/<m>/versions/<v>/drift-reference`, operator).
Nothing here changes what is served: drift is a P2, a ticket for the model's owners, not a rollback.
"""

from __future__ import annotations

import sys

from _runbook import MODEL_NAME, Context, StepFailed, main

THRESHOLD = 0.1  # bits: the shipped rule's threshold (alerts/rules/drift.yaml)
RUNBOOK = {
    "name": "check_drift",
    "description": "Show what drifted for a model (answers, inputs), against which reference, and what to check.",
    "params": {
        "model": {"type": "str", "required": True, "pattern": MODEL_NAME, "help": "model"},
        "window": {
            "type": "str",
            "required": False,
            "default": "1h",
            "pattern": r"[1-9][0-9]{0,4}[smhd]",
            "help": "window scored against the reference, e.g. 1h",
        },
    },
    "role": "viewer",
    "timeout_s": 60,
    "automatic": True,
    "dangerous": False,
    "steps": [
        {"name": "scores", "on_failure": "stop"},
        {"name": "deploys", "on_failure": "continue"},
    ],
}


def _drifted(ctx: Context) -> list[tuple[str, dict]]:
    return [
        (v["version"], s)
        for v in ctx.state["drift"]["versions"]
        for s in v["scores"]
        if s["score"] is not None and s["score"] > THRESHOLD
    ]


def scores(ctx: Context) -> str | None:
    """Every version's scores over the window (highest first), what their pattern says, and each reference."""
    model, window = ctx.params["model"], ctx.params.get("window") or "1h"
    ctx.state["drift"] = found = ctx.get(f"/api/models/{model}/drift", {"window": window})
    if ctx.dry_run:
        return None
    if not found["versions"]:
        raise StepFailed(f"{model} answered nothing in the last {window}: no drift to judge")
    lines = []
    for v in found["versions"]:
        for s in sorted(v["scores"], key=lambda s: -(s["score"] or 0)):
            shown = "too few samples" if s["score"] is None else f"{s['score']:.3f} bits"
            shift = ""
            if s.get("mean") is not None and s.get("reference_mean") is not None:
                shift = f", mean {s['reference_mean']:.4g} -> {s['mean']:.4g}"
            lines.append(f"v{v['version']} {s['kind']}:{s['name']}: {shown} ({s['samples']} samples{shift})")
    return "\n".join([*lines, reading(ctx), *references(ctx)])


def reading(ctx: Context) -> str:
    """Say what the pattern of high scores points at."""
    drifted = _drifted(ctx)
    inputs = sorted({s["name"] for _, s in drifted if s["kind"] == "input"})
    answers = sorted({s["name"] for _, s in drifted if s["kind"] == "predictions"})
    if inputs and answers:
        return (
            f"inputs ({', '.join(inputs)}) and answers ({', '.join(answers)}) moved: callers send different data. "
            "Check upstream: new clients, preprocessing changes, another file type, a broken feed."
        )
    if answers:
        return (
            f"answers ({', '.join(answers)}) moved but the sampled inputs did not: check recent deploys and "
            "rollbacks (next step), and whether the reference window was a normal one."
        )
    if inputs:
        return (
            f"inputs ({', '.join(inputs)}) moved, the answers not yet: tell the model's owners; they may need to "
            "retrain on the new data. Watch the answers."
        )
    return f"no score is over {THRESHOLD} bits now: the drift has passed, or the window is too short to show it."


def references(ctx: Context) -> list[str]:
    """Say which window each version is compared with."""
    lines = []
    for v in ctx.state["drift"]["versions"]:
        ref = v["reference"]
        if ref is None:
            continue
        if ref["source"] == "pinned":
            lines.append(f"v{v['version']} reference: pinned by {ref['pinned_by']}: {ref['start']} .. {ref['end']}")
        else:
            lines.append(
                f"v{v['version']} reference: its first day serving ({ref['start']} .. {ref['end']}); if that day was "
                f"unusual, pin a normal window: PUT /api/models/{ctx.params['model']}/versions/{v['version']}"
                "/drift-reference"
            )
    return lines


def deploys(ctx: Context) -> str | None:
    """The model's last rollout events: a new version answers differently by design."""
    events = ctx.get("/api/audit", {"action": "rollout.*", "since": "-7d", "limit": "200"})
    if ctx.dry_run:
        return None
    rows = [e for e in events["events"] if e["target"] == ctx.params["model"]][:10]
    if not rows:
        return "no rollout events for this model in the last 7 days"
    return "\n".join(f"{e.get('ts')} {e.get('action')} by {e.get('actor')}: {e.get('outcome')}" for e in rows)


STEPS = {"scores": scores, "deploys": deploys}

if __name__ == "__main__":
    sys.exit(main(RUNBOOK, STEPS))
