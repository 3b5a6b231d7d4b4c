"""Steady inference load for a long while: does any Flightdeck process's memory keep growing? (issue 29, item 8)

    python -m bench.soak [--minutes 30] [--warmup-minutes 10] [--short] [--env MALLOC_ARENA_MAX=2]

Starts Flightdeck as `make run` does (a temporary FLIGHTDECK_HOME, the default workers, the scheduler
on, demo models), then drives closed-loop inference (`bench.loadgen`, the demo mlp and textcls with
32 tokens, --concurrency keep-alive clients each) without a pause, one load window per sample. Every
--sample-s it reads each process's RSS, and its anonymous and file-backed parts (/proc/PID/smaps_rollup),
marks the worker that holds the scheduler lease (`leases` in the database) and the size of the
prometheus_client multiprocess directory; it prints one row per sample, then each process's RSS slope
(least squares over the samples after --warmup-minutes) in MB per hour. Goal (the issue's): every
process's slope under 1 MB per hour after warm-up.

--short is for trying things: 4 minutes, a sample every 15 s, 1 minute of warm-up. --env KEY=VALUE
(repeatable) starts the server with that variable, to compare a setting against the defaults.
--csv PATH also writes every sample there.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from bench.loadgen import drive
from bench.measure import request_body, sample_inputs
from bench.peers import (
    WORKLOADS,
    is_job_process,
    registry_models,
    start_flightdeck,
    tree_cpu_by_pid,
    wait_all_workers,
)
from serving.engine import read_manifest
from serving.tensors import ModelSpec

MB = 1e6  # slopes and sizes in MB (10^6 bytes), as the issue states them


@dataclass
class Sample:
    """One reading of every process of the server's tree."""

    t_s: float  # since the load started
    rps: float  # inference answers (200) per second over the last windows, every workload together (nan: none yet)
    rss: dict[int, float]  # pid (JOB_PROCESS: the job process) -> bytes
    anon: dict[int, float]
    file: dict[int, float]
    leader: int | None  # the pid holding the scheduler lease
    job_pid: int | None  # the job process's pid (its readings are under JOB_PROCESS)
    prometheus_bytes: int
    load1: float = field(default_factory=lambda: os.getloadavg()[0])


def memory(pid: int) -> tuple[float, float, float] | None:
    """Return (RSS, anonymous, file-backed) bytes of `pid` from smaps_rollup; None if it is gone."""
    found: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, _, rest = line.partition(":")
            found[key] = float(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None
    rss, anon = found.get("Rss", 0.0), found.get("Anonymous", 0.0)
    return rss, anon, rss - anon


def lease_holder(home: Path) -> int | None:
    """Return the pid in the scheduler lease's holder (NODE:PID:RANDOM), None when no one holds it."""
    with closing(sqlite3.connect(home / "flightdeck.db", timeout=5)) as db:
        row = db.execute("SELECT holder FROM leases WHERE name = 'scheduler'").fetchone()
    try:
        return int(row[0].split(":")[-2]) if row else None
    except (ValueError, IndexError):
        return None


JOB_PROCESS = -1  # the column of the lease holder's job process, whichever pid it has at a sample


def job_process_pid(master: int) -> int | None:
    """Return the pid of the job process in the server's tree now (None while there is none)."""
    return next((pid for pid in tree_cpu_by_pid(master) if is_job_process(pid)), None)


def directory_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes) points, in MB per hour."""
    n = len(points)
    if n < 2:
        return float("nan")
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600 / MB if var else float("nan")


class Load:
    """One closed-loop load generator per workload, each run window after window until stopped."""

    def __init__(self, port: int, bodies: dict[str, tuple[str, bytes]], concurrency: int, window_s: float) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.answered: dict[str, tuple[int, float]] = {}  # workload -> (200s, seconds) of its latest window
        self.failures: dict[int, int] = {}  # every non-200 status over the run
        self.lost_windows = 0  # windows whose result could not be read (the load ran; its count is unknown)
        self._threads = [
            threading.Thread(target=self._run, args=(port, name, path, body, concurrency, window_s), daemon=True)
            for name, (path, body) in bodies.items()
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(300)

    def _run(self, port: int, name: str, path: str, body: bytes, concurrency: int, window_s: float) -> None:
        while not self._stop.is_set():
            try:
                result = drive(port, path, body, concurrency, 0.0, window_s, dict)
            except ValueError:  # NOTE: a result line cut short (seen once in 20 windows on a loaded machine)
                with self._lock:
                    self.lost_windows += 1
                continue
            with self._lock:
                self.answered[name] = (result.statuses.get(200, 0), result.seconds)
                for status, n in result.total.items():
                    if status != 200:
                        self.failures[status] = self.failures.get(status, 0) + n

    def rps(self) -> float:
        with self._lock:
            if not self.answered:
                return float("nan")  # NOTE: the first windows end just after the first sample
            return sum(ok / seconds for ok, seconds in self.answered.values() if seconds)


def bodies_for(home: Path, workloads: list[str]) -> dict[str, tuple[str, bytes]]:
    """Each workload's inference path and OIP JSON body, from the demo models in Flightdeck's registry."""
    folders = registry_models(home, {WORKLOADS[w][0] for w in workloads})
    found = {}
    for workload in workloads:
        model, seq_len = WORKLOADS[workload]
        spec = ModelSpec.from_manifest(read_manifest(folders[model]))
        found[workload] = (f"/v2/models/{model}/infer", request_body(sample_inputs(spec, 1, seq_len), spec))
    return found


def print_row(sample: Sample, pids: list[int]) -> None:
    cells = []
    for pid in pids:
        mark = "*" if pid == sample.leader else " "
        rss, anon = sample.rss.get(pid), sample.anon.get(pid)
        cells.append(f"{rss / MB:7.1f}{mark}{anon / MB:6.1f}" if rss is not None and anon is not None else " " * 14)
    print(f"{sample.t_s / 60:6.1f} {sample.rps:7.0f} {sample.load1:5.1f} {sample.prometheus_bytes / MB:6.1f}  "
          + "  ".join(cells), flush=True)  # fmt: skip


def summarise(samples: list[Sample], pids: list[int], master: int, warmup_s: float) -> None:
    after = [s for s in samples if s.t_s >= warmup_s]
    print(f"\nslopes over the {len(after)} samples from minute {warmup_s / 60:g} to {samples[-1].t_s / 60:.1f} "
          "(least squares, MB per hour; goal: RSS under 1 MB/h for every process)")  # fmt: skip
    print(f"{'process':>16} {'RSS MB first':>12} {'last':>7} {'RSS MB/h':>9} {'anon MB/h':>9} {'file MB/h':>9}")
    for pid in pids:
        rss = [(s.t_s, s.rss[pid]) for s in after if pid in s.rss]
        if not rss:
            continue
        anon = [(s.t_s, s.anon[pid]) for s in after if pid in s.anon]
        file = [(s.t_s, s.file[pid]) for s in after if pid in s.file]
        led = sum(1 for s in after if s.leader == pid)
        role = "master" if pid == master else ("worker, leader" if led > len(after) / 2 else "worker")
        name = "job process" if pid == JOB_PROCESS else f"{role} {pid}"
        print(f"{name:>16} {rss[0][1] / MB:12.1f} {rss[-1][1] / MB:7.1f} {slope_per_hour(rss):9.2f} "
              f"{slope_per_hour(anon):9.2f} {slope_per_hour(file):9.2f}")  # fmt: skip
    prom = [(s.t_s, float(s.prometheus_bytes)) for s in after]
    print(f"{'prometheus dir':>16} {prom[0][1] / MB:12.1f} {prom[-1][1] / MB:7.1f} {slope_per_hour(prom):9.2f}")
    jobs = [s.job_pid for s in samples if s.job_pid]
    if jobs:
        rss = [s.rss[JOB_PROCESS] for s in after if JOB_PROCESS in s.rss]
        starts = len({*jobs})
        print(f"job process: {starts} process(es) over the run ({starts - 1} replaced), "
              f"RSS {min(rss) / MB:.1f}-{max(rss) / MB:.1f} MB after warm-up")  # fmt: skip
    leaders = {s.leader for s in samples}
    if len(leaders) > 1:
        print(f"NOTE: the lease moved during the run: holders {sorted(p for p in leaders if p)}")


def run(args: argparse.Namespace) -> int:
    folder = Path(tempfile.mkdtemp(prefix="flightdeck-soak-"))
    home = folder / "home"
    overrides = dict(item.split("=", 1) for item in args.env)
    server = start_flightdeck(home, overrides)
    samples: list[Sample] = []
    try:
        server.wait_ready()
        workers = wait_all_workers(server, home)
        master = server.process.pid
        bodies = bodies_for(home, args.workloads.split(","))
        print(f"Flightdeck on 127.0.0.1:{server.port}, {workers} worker(s), settings {overrides or 'as make run'}; "
              f"load: {', '.join(bodies)} x {args.concurrency} clients each, closed loop; {args.minutes:g} min, "
              f"a sample every {args.sample_s:g} s, warm-up {args.warmup_minutes:g} min; {os.cpu_count()} cores")  # fmt: skip
        pids = sorted((p for p in tree_cpu_by_pid(master) if not is_job_process(p)), key=lambda p: (p != master, p))
        pids.append(JOB_PROCESS)
        names = {master: f"master {master}", JOB_PROCESS: "job process"}
        print(f"\n{'min':>6} {'req/s':>7} {'load1':>5} {'prom':>6}  "
              + "  ".join(f"{names.get(p, f'worker {p}'):>14}" for p in pids))  # fmt: skip
        print(f"{'':>6} {'':>7} {'':>5} {'MB':>6}  " + "  ".join(f"{'RSS MB   anon':>14}" for _ in pids))
        start = time.monotonic()
        with Load(server.port, bodies, args.concurrency, args.sample_s) as load:
            for i in range(1, int(args.minutes * 60 / args.sample_s) + 1):
                time.sleep(max(0.0, start + i * args.sample_s - time.monotonic()))
                if server.process.poll() is not None:
                    raise RuntimeError(f"Flightdeck exited with {server.process.returncode}")
                job = job_process_pid(master)
                readings = {pid: memory(job if pid == JOB_PROCESS else pid) if pid != JOB_PROCESS or job else None
                            for pid in pids}  # fmt: skip
                sample = Sample(
                    time.monotonic() - start, load.rps(),
                    {p: m[0] for p, m in readings.items() if m}, {p: m[1] for p, m in readings.items() if m},
                    {p: m[2] for p, m in readings.items() if m}, lease_holder(home), job,
                    directory_bytes(home / "prometheus"),
                )  # fmt: skip
                samples.append(sample)
                print_row(sample, pids)
                if args.csv:
                    write_csv(Path(args.csv), samples, pids)
            failures, lost = dict(load.failures), load.lost_windows
        new = {p for p in tree_cpu_by_pid(master) if not is_job_process(p)} - set(pids)
        if new:
            print(f"NOTE: processes started during the run, not followed: {sorted(new)} (a worker restarted?)")
    finally:
        server.stop()
    print("(* : the worker holding the scheduler lease at that sample)")
    summarise(samples, pids, master, args.warmup_minutes * 60)
    print(f"non-200 answers over the run: {failures or 'none'}" + (f"; {lost} load windows unread" if lost else ""))
    shutil.rmtree(folder, ignore_errors=True)  # NOTE: only after a whole run; a failed one leaves its log there
    return 0


def write_csv(path: Path, samples: list[Sample], pids: list[int]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["t_s", "rps", "load1", "prometheus_bytes", "pid", "leader", "rss", "anon", "file"])
        for s in samples:
            for pid in pids:
                if pid in s.rss:
                    writer.writerow([f"{s.t_s:.1f}", f"{s.rps:.0f}", s.load1, s.prometheus_bytes, pid,
                                     int(pid == s.leader), s.rss[pid], s.anon[pid], s.file[pid]])  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warmup-minutes", type=float, default=10.0, help="samples before this are left out of slopes")
    p.add_argument("--sample-s", type=float, default=60.0)
    p.add_argument("--short", action="store_true", help="4 minutes, a sample every 15 s, 1 minute of warm-up")
    p.add_argument("--workloads", default="mlp,textcls32", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--concurrency", type=int, default=8, help="keep-alive clients per workload")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set for the server (repeatable)")
    p.add_argument("--csv", help="write every sample to this file as well")
    args = p.parse_args(argv)
    if args.short:
        args.minutes, args.sample_s, args.warmup_minutes = 4.0, 15.0, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    # NOTE: `kill` stops a soak as Ctrl-C does, through run's `finally`: the server and its job process with it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
