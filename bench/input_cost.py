"""Micro-benchmark: what summarising numeric inputs for drift costs per request (`python -m bench.input_cost`).

First the summary alone (`serving.inputstats.features_of` + `add_values`: what the batcher runs for a
sampled request, outside and then under its lock) for inputs of four shapes; then, in-process on the
real engine and the demo `mlp` (ONNX Runtime), the same serial requests with inputs summarised for
every request, for one in 16 (the default, FLIGHTDECK_DRIFT_SAMPLE_EVERY) and never, in alternating
rounds. Prints microseconds and the share of a request's engine time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import timeit
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.measure import serial_us
from controlplane.config import load_settings
from serving import inputstats
from serving.demo_models import write_demo_models
from serving.engine import Engine

SHAPES = {
    "tabular [1, 4] float32": ((1, 4), np.float32),
    "mlp [1, 64] float32": ((1, 64), np.float32),
    "magika [1, 2048] int32": ((1, 2048), np.int32),
    "image [1, 3, 224, 224] float32": ((1, 3, 224, 224), np.float32),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    alone = {}
    for label, (shape, dtype) in SHAPES.items():
        tensors = {"x": (rng.random(shape) * 100).astype(dtype)}
        summaries: dict = {}

        def once(tensors: dict = tensors, summaries: dict = summaries) -> None:
            inputstats.add_values(summaries, inputstats.features_of(tensors, 1))

        # NOTE: the least of 7 repeats: on a shared machine, other work only ever adds time.
        alone[label] = best = min(timeit.repeat(once, number=2000, repeat=7)) / 2000 * 1e6
        print(f"summary of one sampled request, {label}: {best:.2f} us; at 1 in 16: {best / 16:.2f} us/request")
    with tempfile.TemporaryDirectory(prefix="flightdeck-inputs-") as tmp:
        store = Path(tmp) / "store"
        write_demo_models(store)
        settings = load_settings(environ={}, overrides={"home": tmp})
        engines = {}
        for every in (1, 16, 0):
            engine = Engine(settings.runtime, replace(settings.batching_settings, input_sample_every=every))
            engine.load(store / "mlp" / "1", "blue")
            engines[every] = engine
        tensors = {"input": rng.standard_normal((1, 64)).astype(np.float32)}
        times: dict[int, list[float]] = {every: [] for every in engines}
        try:
            for engine in engines.values():
                serial_us(engine, "mlp", tensors, 300)  # warm up
            order = list(engines)
            for _ in range(args.rounds):
                for every in order:  # NOTE: rotated each round, so no setting always runs first or last
                    times[every].append(serial_us(engines[every], "mlp", tensors, args.requests))
                order = order[1:] + order[:1]
        finally:
            for engine in engines.values():
                engine.drain(5)
    off = statistics.median(times[0])
    print(f"engine.infer on mlp, batch 1, serial, median of {args.rounds} rounds of {args.requests}:")
    for every, label in ((0, "never summarised"), (16, "1 in 16 (default)"), (1, "every request")):
        us = statistics.median(times[every])
        paired = statistics.median(a - b for a, b in zip(times[every], times[0], strict=True))
        print(f"  {label}: {us:.1f} us/request, {paired:+.1f} us against never ({paired / off:+.1%})")
    print(
        f"the summary alone of mlp's input is {alone['mlp [1, 64] float32']:.2f} us, "
        f"{alone['mlp [1, 64] float32'] / off:.1%} of a request's {off:.0f} us; at 1 in 16, "
        f"{alone['mlp [1, 64] float32'] / 16 / off:.2%}"
    )
    print("(the machine's cores were shared with other work while this ran: compare within one run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
