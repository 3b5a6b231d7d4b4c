"""The model's own ceiling: plain ONNX Runtime, no HTTP, no queue, at its best batch size and layout.

Issue 26 asks that a server at saturation reach 90 % of what plain ONNX Runtime does with the same
cores where the model, not HTTP, is the bound. `ceiling` measures that figure in the benchmark's own
run (same machine, same load around it): for each layout (several processes of one intra-op thread,
one per core, and one process with every core, spinning) and each batch size, every process runs
`session.run` in a loop over the same window, started together at a barrier, and the samples they
finished are added up. The table of all of them says where batching stops paying.

The ceiling is the best cell measured again, on its own, over a window as long as the server's
(`confirm`; bench.peers takes it right after the server's cell it judges, as this VM's speed drifts by
a fifth within minutes). The best of a dozen short, noisy cells reads high (one layout gave 352 and 394
samples/s in two windows a minute apart; textcls seq 32's best, 1732, measured 1328 again), and a server
measured once would be judged against the luckiest of them; picking on one measurement and reporting
another removes that bias.

    python -m bench.rawort --workload textcls128 [--seconds 1.5] [--batches 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BATCHES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Layout:
    """How the cores are used: `processes` each running one caller with `threads` intra-op threads."""

    processes: int
    threads: int

    def __str__(self) -> str:
        return f"{self.processes} proc x {self.threads} thr"


@dataclass
class Ceiling:
    """Samples per second of every (layout, batch) measured, and the best of them."""

    workload: str
    rates: dict[tuple[Layout, int], float] = field(default_factory=dict)
    confirmed: float | None = None  # the best cell's samples/s, measured again on its own (None: not measured)

    @property
    def best(self) -> tuple[Layout, int, float]:
        (layout, batch), rate = max(self.rates.items(), key=lambda item: item[1])
        return layout, batch, rate

    @property
    def reference(self) -> tuple[Layout, int, float]:
        """The best cell and the figure to judge a server by: its second measurement where there is one."""
        layout, batch, rate = self.best
        return layout, batch, rate if self.confirmed is None else self.confirmed


def layouts(cores: int) -> list[Layout]:
    """One single-threaded process per core (what Flightdeck's workers do), and one process with every core."""
    return [Layout(cores, 1)] if cores == 1 else [Layout(cores, 1), Layout(1, cores)]


def _runner(
    model: str, manifest: dict, seq_len: int, threads: int, batches: tuple[int, ...], seconds: float, barrier, results
) -> None:  # fmt: skip
    """One process of a layout: time `session.run` at each batch size between barriers; put (batch, samples, s)."""
    from bench.measure import sample_inputs
    from serving.runtime import load_session
    from serving.settings import RuntimeSettings
    from serving.tensors import ModelSpec

    # NOTE: spinning where a process has several threads: nothing else runs here, so it is their best case.
    session = load_session(Path(model), RuntimeSettings(intra_op_threads=threads, allow_spinning=threads > 1))
    spec = ModelSpec.from_manifest(manifest)
    for batch in batches:
        inputs = sample_inputs(spec, batch, seq_len)
        session.run(inputs)  # its first run at this shape allocates; not timed
        barrier.wait()
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            session.run(inputs)
            done += batch
        results.put((batch, done, elapsed))


def measure_layout(
    model: Path, manifest: dict, seq_len: int, layout: Layout, batches: tuple[int, ...], seconds: float
) -> dict[int, float]:  # fmt: skip
    """Return {batch: samples/s summed over the layout's processes}."""
    ctx = mp.get_context("spawn")  # NOTE: a fresh interpreter each: no ONNX Runtime thread pool inherited by fork
    barrier, results = ctx.Barrier(layout.processes), ctx.Queue()
    args = (str(model), manifest, seq_len, layout.threads, batches, seconds, barrier, results)
    procs = [ctx.Process(target=_runner, args=args, daemon=True) for _ in range(layout.processes)]
    for p in procs:
        p.start()
    rates = dict.fromkeys(batches, 0.0)
    try:
        for _ in range(layout.processes * len(batches)):
            batch, done, elapsed = results.get(timeout=120 + seconds * len(batches))
            rates[batch] += done / elapsed
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise RuntimeError(f"raw ONNX Runtime runner(s) failed with exit code(s) {failed}")
    return rates


def ceiling(
    workload: str, model: Path, manifest: dict, seq_len: int, seconds: float = 1.5, batches: tuple[int, ...] = BATCHES,
    cores: int | None = None, confirm_s: float = 0.0,
) -> Ceiling:  # fmt: skip
    """Measure every layout at every batch size, then the best cell again over `confirm_s` (0: not again)."""
    result = Ceiling(workload)
    for layout in layouts(cores or os.cpu_count() or 1):
        for batch, rate in measure_layout(model, manifest, seq_len, layout, batches, seconds).items():
            result.rates[(layout, batch)] = rate
    if confirm_s > 0:
        confirm(result, model, manifest, seq_len, confirm_s)
    return result


def confirm(c: Ceiling, model: Path, manifest: dict, seq_len: int, seconds: float) -> float:
    """Measure the best cell again on its own over `seconds`; keep it as `c.confirmed` and return it."""
    layout, batch, _ = c.best
    c.confirmed = measure_layout(model, manifest, seq_len, layout, (batch,), seconds)[batch]
    return c.confirmed


def print_ceiling(c: Ceiling) -> None:
    """One line per layout, samples/s at each batch size, then the best."""
    batches = sorted({b for _, b in c.rates})
    print(f"raw ONNX Runtime, {c.workload} (no HTTP), samples/s by batch size:")
    print(f"  {'layout':<16}" + "".join(f"{b:>9}" for b in batches))
    for layout in dict.fromkeys(layout for layout, _ in c.rates):
        print(f"  {str(layout):<16}" + "".join(f"{c.rates.get((layout, b), float('nan')):>9.0f}" for b in batches))
    layout, batch, rate = c.best
    again = "" if c.confirmed is None else f"; measured again on its own: {c.confirmed:.0f} (the reference)"
    print(f"  best: {rate:.0f} samples/s at batch {batch}, {layout}{again}")


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from bench.measure import WORKLOADS
    from serving.demo_models import build_model, demo_manifest

    p = argparse.ArgumentParser(prog="python -m bench.rawort", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="textcls128", choices=sorted(WORKLOADS))
    p.add_argument("--seconds", type=float, default=1.5, help="window per layout and batch size")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--confirm-seconds", type=float, default=4.0, help="window of the best cell's second measurement")
    args = p.parse_args(argv)
    name, seq_len = WORKLOADS[args.workload]
    built = build_model(name, "1")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.onnx"
        model.write_bytes(built.SerializeToString())
        batches = tuple(int(b) for b in args.batches.split(",") if b)
        manifest = demo_manifest(name, "1", built)
        print_ceiling(
            ceiling(args.workload, model, manifest, seq_len, args.seconds, batches, None, args.confirm_seconds)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
