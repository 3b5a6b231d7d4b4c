"""The canary lab: real rollouts on a real server under load, judged, and a confusion matrix (`python -m bench.canary_lab`).

Starts the real server (gunicorn, FLIGHTDECK_WORKERS workers) serving a lab classifier `lab`
(64 -> 512 -> 512 -> 10, softmax), keeps closed-loop clients busy on it with varied inputs, and
runs canary rollouts of candidate versions against v1, one after another:

- A/A (should be promoted): `2`, v1's architecture with other weights (v1 plus 2 % weight noise:
  same cost, the same top class on most inputs); `3`, the very same file as v1 pushed again.
- A/B (should be rolled back): `4`, v1 with three 512x512 identity layers added (the same answers,
  2-3x the compute per sample, measured in the judge's evidence); `5`, v1 failing about 2 % of its runs with a server error (a
  Reshape whose target shape depends on a random draw); `6`, v1 whose answers collapse to one class.

Each rollout runs its steps (`--steps`, `--pause` seconds each) under the judge's default policy;
a promoted A/A version is rolled back by hand before the next case, a paused (inconclusive) one is
aborted. Prints, per load level, each rollout's outcome, its deciding reason and the time from its
last step's start to the verdict, then the confusion matrix. The size is configurable: the issue's
goal is 20 A/A rollouts (`--repeats 10 --loads 4,16`); on the shared 2-core machine a reduced run
(`--repeats 1 --loads 8`) takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.engine import Server
from bench.rollout import Traffic, call, operator_token

MODEL = "lab"
IN, HIDDEN, OUT = 64, 512, 10
CASES = (  # (version, what it is, what the judge should do)
    ("2", "A/A other weights (2 % noise)", "promote"),
    ("3", "A/A the same file again", "promote"),
    ("4", "A/B 2-3x compute per sample", "rollback"),
    ("5", "A/B fails 2 % of runs (server error)", "rollback"),
    ("6", "A/B answers collapse to one class", "rollback"),
)
EXPECTED = {version: expected for version, _, expected in CASES}


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def dense(d_in: int, d_out: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
        return (
            (rng.standard_normal((d_in, d_out)) * scale).astype(np.float32),
            (rng.standard_normal(d_out) * scale).astype(np.float32),
        )

    w1, b1 = dense(IN, HIDDEN, np.sqrt(2 / IN))
    w2, b2 = dense(HIDDEN, HIDDEN, np.sqrt(2 / HIDDEN))
    w3, b3 = dense(HIDDEN, OUT, np.sqrt(2 / (HIDDEN + OUT)))
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "b3": b3}


def build(weights: dict[str, np.ndarray], *, identity_layers: int = 0, error_rate: float = 0.0) -> onnx.ModelProto:
    """The lab classifier; optionally slower (identity layers: same answers) or failing some runs."""
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in weights.items()]

    def op(kind: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], name=f"{out}/{kind}", **attrs))
        return out

    x = "input"
    if error_rate:
        # A random draw per run: under `error_rate`, the target shape is [-1, 65], which no [n, 64] input fits.
        inits += [
            numpy_helper.from_array(np.array(error_rate, np.float32), "rate"),
            numpy_helper.from_array(np.array([IN], np.int64), "width"),
            numpy_helper.from_array(np.array([-1], np.int64), "rows"),
        ]
        first = op("ReduceMax", ["input"], "first", axes=[1], keepdims=1)
        draw = op("RandomUniformLike", [first], "draw")
        hit = op("Cast", [op("Less", [draw, "rate"], "below")], "hitf", to=TensorProto.FLOAT)
        any_hit = op("Cast", [op("ReduceMax", [hit], "anyf", keepdims=1)], "any", to=TensorProto.INT64)
        width = op("Add", ["width", op("Reshape", [any_hit, "rows_one"], "any1")], "width2")
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "rows_one"))
        x = op("Reshape", ["input", op("Concat", ["rows", width], "shape", axis=0)], "checked")
    h = op("Relu", [op("Add", [op("MatMul", [x, "w1"], "m1"), "b1"], "a1")], "h1")
    h = op("Relu", [op("Add", [op("MatMul", [h, "w2"], "m2"), "b2"], "a2")], "h2")
    if identity_layers:
        inits += [
            numpy_helper.from_array(np.eye(HIDDEN, dtype=np.float32), "eye"),
            numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "zero"),
        ]
        for i in range(identity_layers):  # h >= 0 after a Relu, so Relu(h @ I + 0) == h: more work, same answers
            h = op("Relu", [op("Add", [op("MatMul", [h, "eye"], f"mi{i}"), "zero"], f"ai{i}")], f"hi{i}")
    logits = op("Add", [op("MatMul", [h, "w3"], "m3"), "b3"], "logits")
    op("Softmax", [logits], "probabilities", axis=-1)
    graph = helper.make_graph(
        nodes, MODEL,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", OUT])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="flightdeck-lab")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_lab_models(store: Path) -> None:
    """Write versions 1-6 of `lab` (see the module's doc) as a plain store: model.onnx + manifest.json."""
    base = _weights(1)
    rng = np.random.default_rng(2)
    noisy = {k: (v * (1 + 0.02 * rng.standard_normal(v.shape))).astype(np.float32) for k, v in base.items()}
    collapsed = dict(base)
    collapsed["b3"] = base["b3"].copy()
    collapsed["b3"][0] += 12.0
    models = {
        "1": build(base), "2": build(noisy), "3": build(base), "4": build(base, identity_layers=3),
        "5": build(base, error_rate=0.02), "6": build(collapsed),
    }  # fmt: skip
    for version, model in models.items():
        folder = store / MODEL / version
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.onnx").write_bytes(model.SerializeToString())
        manifest = {
            "name": MODEL, "version": version, "platform": "onnxruntime_onnx",
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, IN]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, OUT]}],
            "batching": {"max_batch_size": 64},
            "metadata": {"description": f"canary lab classifier, version {version}"},
        }  # fmt: skip
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def lab_bodies(seed: int) -> list[bytes]:
    """Return 256 varied single-sample requests for the lab model."""
    rng = np.random.default_rng(seed)
    return [
        json.dumps(
            {"inputs": [{"name": "input", "shape": [1, IN], "datatype": "FP32",
                         "data": [round(float(v), 3) for v in rng.standard_normal(IN)]}]}
        ).encode()
        for _ in range(256)
    ]  # fmt: skip


def _wait(port: int, token: str, rollout_id: int, states: set[str], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        rollout = call(port, "GET", f"/api/rollouts/{rollout_id}", token)
        if rollout["state"] in states:
            return rollout
        if time.monotonic() > deadline:
            raise RuntimeError(f"rollout {rollout_id} still {rollout['state']} after {timeout_s:.0f} s")
        time.sleep(0.25)


def run_case(port: int, token: str, version: str, steps: list[int], pause_s: float) -> dict:
    """Deploy `version` as a canary, wait for its end (or a pause), put v1 back; return what happened."""
    body = {"version": version, "steps": steps, "pause_s": pause_s}
    rollout = call(port, "POST", f"/api/models/{MODEL}/deploy", token, body)
    done = _wait(port, token, rollout["id"], {"succeeded", "rolled_back", "paused"}, 60 + 10 * pause_s * len(steps))
    outcome = {"succeeded": "promote", "rolled_back": "rollback", "paused": "paused"}[done["state"]]
    last = done["measurements"][-1] if done["measurements"] else None
    to_verdict = None
    if last is not None:
        window = next((e for e in last["evidence"] if e["check"] == "window"), None)
        if window is not None:
            to_verdict = (datetime.fromisoformat(last["ts"]) - datetime.fromisoformat(window["start"])).total_seconds()
    if done["state"] == "paused":
        call(port, "POST", f"/api/rollouts/{done['id']}/abort", token)
    elif done["state"] == "succeeded":
        back = call(port, "POST", f"/api/models/{MODEL}/rollback", token)
        _wait(port, token, back["rollout"], {"succeeded"}, 60)
    return {
        "version": version, "outcome": outcome, "reason": done["reason"], "to_verdict_s": to_verdict,
        "steps_judged": len(done["measurements"]),
        "latency": next((e for e in (last or {}).get("evidence", []) if e["check"] == "latency"), None),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default="4,16", help="client concurrencies, one pass of every case each")
    parser.add_argument("--repeats", type=int, default=2, help="passes of every case per load")
    parser.add_argument("--steps", default="10,50,100", help="canary traffic percentages")
    parser.add_argument("--pause", type=float, default=8.0, help="seconds per step before its verdict")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn workers")
    parser.add_argument("--cases", default=",".join(v for v, _, _ in CASES), help="candidate versions to run")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    versions = args.cases.split(",")
    results: list[tuple[int, dict]] = []
    with tempfile.TemporaryDirectory(prefix="flightdeck-canary-lab-") as tmp:
        store, home = Path(tmp) / "store", Path(tmp) / "home"
        write_lab_models(store)
        home.mkdir()
        token = operator_token(home)
        env = {
            "FLIGHTDECK_LOAD_MODELS": MODEL, "FLIGHTDECK_WORKERS": str(args.workers),
            "FLIGHTDECK_ROLLOUT_TICK_S": "0.5", "FLIGHTDECK_HISTORY_INTERVAL_S": "2",
            "FLIGHTDECK_SCALE_DOWN_DELAY_S": "3600",
        }  # fmt: skip
        server = Server(store, home, env)
        try:
            server.wait_ready()
            for load in [int(c) for c in args.loads.split(",")]:
                traffic = Traffic(server.port, load, MODEL, lab_bodies(load))
                try:
                    time.sleep(2)  # NOTE: a warm-up of the load, not synchronisation
                    before = len(traffic.seen)
                    started = time.monotonic()
                    for _ in range(args.repeats):
                        for version in versions:
                            result = run_case(server.port, token, version, steps, args.pause)
                            results.append((load, result))
                            print(_line(load, result), flush=True)
                    rate = (len(traffic.seen) - before) / (time.monotonic() - started)
                    print(f"  load c={load}: {rate:.0f} req/s on average, statuses {dict(traffic.statuses())}")
                finally:
                    traffic.close()
        finally:
            server.stop()
    _report(results, steps, args.pause)
    return 0


def _line(load: int, r: dict) -> str:
    latency = r["latency"] or {}
    effect = latency.get("effect", {})
    verdict = f"{r['to_verdict_s']:.1f} s" if r["to_verdict_s"] is not None else "-"
    ok = "ok " if r["outcome"] == EXPECTED[r["version"]] else "BAD"
    return (
        f"{ok} c={load:<3} v{r['version']} {EXPECTED[r['version']]:<8} -> {r['outcome']:<8} "
        f"last step {verdict:>7}  compute ratio {effect.get('ratio')}  {r['reason'][:150]}"
    )


def _report(results: list[tuple[int, dict]], steps: list[int], pause_s: float) -> None:
    print(f"\nConfusion matrix ({len(results)} rollouts, steps {steps}, {pause_s:g} s pause):")
    print(f"{'':<42}{'promoted':>10}{'rolled back':>13}{'paused':>8}")
    for version, what, expected in CASES:
        row = Counter(r["outcome"] for _, r in results if r["version"] == version)
        if row:
            print(
                f"  v{version} {what:<38}{row['promote']:>10}{row['rollback']:>13}{row['paused']:>8}  (expected: {expected})"
            )
    aa = [r for _, r in results if EXPECTED[r["version"]] == "promote"]
    ab = [r for _, r in results if EXPECTED[r["version"]] == "rollback"]
    false_rollbacks = sum(r["outcome"] == "rollback" for r in aa)
    caught = sum(r["outcome"] == "rollback" for r in ab)
    print(f"  A/A: {false_rollbacks} false rollbacks, {sum(r['outcome'] == 'paused' for r in aa)} paused, in {len(aa)}")
    print(f"  A/B: {caught} of {len(ab)} caught")
    times = [r["to_verdict_s"] for r in ab if r["outcome"] == "rollback" and r["to_verdict_s"] is not None]
    if times:
        print(
            f"  A/B time from the failing step's start to the rollback: median {statistics.median(times):.1f} s, "
            f"max {max(times):.1f} s (the step's pause: {pause_s:g} s)"
        )
    print("(the machine's 2 cores were shared with other work while this ran)")


if __name__ == "__main__":
    raise SystemExit(main())
