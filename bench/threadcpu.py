"""Where a running server's CPU goes, thread by thread, at one load: `python -m bench.threadcpu`.

Starts Flightdeck as `make run` does (or with `--env FLIGHTDECK_X=VALUE` changes), drives one demo
workload closed-loop with bench.loadgen, and reads every thread's CPU time from /proc as the window
opens and closes. Prints, per worker, its event loop (the process's main thread), each executor (named
`<model>-<slot>/<n>` in the kernel, serving.threadnames) and the other threads (ONNX Runtime's
intra-op pool of a lone-request session, the scheduler, ...), as % of a core, CPU µs per request
(over every request the server answered) and context switches per request; then the totals by role.

    python -m bench.threadcpu --workload textcls128 --concurrency 32 --seconds 8

Issue 26's seq 128 gap was found this way: the executors' CPU per request matched plain ONNX Runtime's
at the batch formed, and the event loops cost 0.6 ms per request (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import drive
from bench.measure import WORKLOADS, request_body, sample_inputs
from bench.peers import flightdeck_running, learned
from serving.nodeload import CLK_TCK


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's counters: CPU seconds (user + system), system seconds, context switches."""

    pid: int
    tid: int
    name: str
    cpu_s: float
    sys_s: float
    switches: int


def threads_of(root: int) -> dict[tuple[int, int], ThreadTimes]:
    """Every thread of `root` and its children, from /proc (a thread gone while read is left out)."""
    pids = [root]
    children = Path(f"/proc/{root}/task/{root}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    found: dict[tuple[int, int], ThreadTimes] = {}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = (task / "status").read_text().splitlines()
            except OSError:
                continue
            switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
            utime, stime = int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK
            found[(pid, int(task.name))] = ThreadTimes(pid, int(task.name), name, utime + stime, stime, switches)
    return found


def role(t: ThreadTimes) -> str:
    """What a thread does: the worker's event loop (its main thread), an executor (named by the batcher), other."""
    if t.pid == t.tid:
        return "event loop"
    if "/" in t.name and t.name.rsplit("/", 1)[1].isdigit():
        return "executor"
    return "other"


def report(before: dict, after: dict, wall_s: float, requests: int, master: int) -> list[str]:
    """Lines: each thread that used CPU in the window, by worker, then the totals by role."""
    lines = [
        f"{'worker':>8} {'thread':<16} {'role':<11}{'% core':>8}{'CPU µs/req':>12}{'sys µs/req':>12}{'switches/req':>14}"
    ]
    totals: dict[str, float] = {}
    rows = []
    for key, now in after.items():
        was = before.get(key)
        if was is None or now.pid == master:
            continue
        cpu = now.cpu_s - was.cpu_s
        if cpu <= 0:
            continue
        rows.append((now, cpu, now.sys_s - was.sys_s, now.switches - was.switches))
        totals[role(now)] = totals.get(role(now), 0.0) + cpu
    for t, cpu, sys_s, switches in sorted(rows, key=lambda r: (r[0].pid, -r[1])):
        lines.append(
            f"{t.pid:>8} {t.name[:16]:<16} {role(t):<11}{100 * cpu / wall_s:>8.1f}{1e6 * cpu / requests:>12.0f}"
            f"{1e6 * sys_s / requests:>12.0f}{switches / requests:>14.2f}"
        )
    lines.append("totals: " + ", ".join(
        f"{name} {100 * cpu / wall_s:.0f} % of a core, {1e6 * cpu / requests:.0f} µs/req"
        for name, cpu in sorted(totals.items(), key=lambda item: -item[1])
    ))  # fmt: skip
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.threadcpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="textcls128", choices=sorted(WORKLOADS))
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--env", action="append", default=[], metavar="FLIGHTDECK_X=VALUE", help="a changed setting")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, seq_len = WORKLOADS[args.workload]
    overrides = dict(item.split("=", 1) for item in args.env)
    with flightdeck_running(overrides, "flightdeck-threadcpu-") as running:
        server, workers = running.server, running.workers
        spec = running.spec(model)
        shown = learned(server.port, model)
        body = request_body(sample_inputs(spec, 1, seq_len), spec)
        seen: list[tuple[float, dict]] = []

        def probe() -> dict:
            seen.append((time.perf_counter(), threads_of(server.process.pid)))
            return {"t": seen[-1][0]}

        window = drive(
            server.port, f"/v2/models/{model}/infer", body, args.concurrency, args.warmup, args.seconds, probe
        )
    ok = window.statuses.get(200, 0)
    print(shown)
    (t0, before), (t1, after) = seen[0], seen[-1]
    print(f"{args.workload} c={args.concurrency}, {workers} worker(s), settings {overrides or 'as make run'}: "
          f"{ok / window.seconds:.0f} req/s, statuses {dict(window.statuses)}")  # fmt: skip
    if not ok:
        return 1
    for line in report(before, after, t1 - t0, ok, server.process.pid):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
