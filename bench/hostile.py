"""Steady inference load while hostile clients arrive: does Flightdeck keep serving? (issue 29)

    python -m bench.hostile [--seconds 12] [--slowloris 250] [--stalled 20] [--big 2]

Starts Flightdeck as `make run` does (its own data directory, demo models, one worker by default,
deadlines lowered to --timeout seconds so they act within a short run, `--worker-connections` lower
than the slow heads so that eviction acts too), then runs the same closed-loop inference load
(`bench.loadgen`, the demo mlp) twice: clean, then while an attacker process keeps open

- slowloris heads: connections that send part of a request head and one more header line a second;
- stalled bodies: `/v2` requests announcing 16 MiB, sending 1 MiB, then nothing; and Flask ones
  (`POST /api/session`) announcing 1 KiB and sending 10 bytes, holding its threads;
- big BYTES bodies: 16 MB requests of empty strings, each decoded then refused, back to back;

each reopened as soon as the server closes it. Meanwhile `/v2/health/live` is probed every 50 ms on a
fresh connection, as a kubelet does. It prints accepted req/s of both runs and their ratio, the
probes' p50/p99/max, the worker's RSS before, at the attack's end and after it, connections closed
by each deadline, any 5xx, and the loop lag the server reports. Goals (the issue's): throughput at
least 90 % of the clean run, probe p99 under 50 ms, RSS back within 64 MiB, no 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import uvloop

from bench.loadgen import Result, drive
from bench.peers import start_flightdeck, tree_cpu_by_pid, wait_all_workers

ROOT = Path(__file__).resolve().parent.parent
MLP_BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]})
BIG_COUNT = (16 * 1024 * 1024 - 4096) // 3  # '"",' per element: a body just under the 16 MiB limit


# -- the attacker (a process of its own, so its work never shares the probes' GIL) ---------------------


async def _slowloris(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set() and not reader.at_eof():
                await asyncio.sleep(1.0)
                writer.write(b"X-Drip: a\r\n")
                await writer.drain()
            writer.close()
        except OSError:
            await asyncio.sleep(0.05)


async def _stalled(port: int, stop: asyncio.Event, head: bytes, part: bytes) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head + part)
            await writer.drain()
            await reader.read()  # until the server answers (408) and closes
            writer.close()
        except OSError:
            await asyncio.sleep(0.05)


async def _big(port: int, stop: asyncio.Event, body: bytes, statuses: dict[str, int]) -> None:
    head = (
        b"POST /v2/models/textcls/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head + body)
            await writer.drain()
            answer = await reader.read()
            status = answer[9:12].decode() or "closed"
            statuses[status] = statuses.get(status, 0) + 1
            writer.close()
        except OSError:
            statuses["error"] = statuses.get("error", 0) + 1
            await asyncio.sleep(0.05)


async def attack(port: int, slowloris: int, stalled: int, flask_stalled: int, big: int) -> dict[str, int]:
    """Keep the hostile connections open until stdin closes; return the big bodies' answers by status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), stop.set)
    request = {"inputs": [{"name": "text", "shape": [BIG_COUNT], "datatype": "BYTES", "data": [""] * BIG_COUNT}]}
    body = json.dumps(request, separators=(",", ":"))
    statuses: dict[str, int] = {}
    v2_head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (16 * 1024 * 1024)
    flask_head = (
        b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    tasks = [loop.create_task(_slowloris(port, stop)) for _ in range(slowloris)]
    tasks += [loop.create_task(_stalled(port, stop, v2_head, b" " * (1024 * 1024))) for _ in range(stalled)]
    tasks += [loop.create_task(_stalled(port, stop, flask_head, b'{"name": "')) for _ in range(flask_stalled)]
    tasks += [loop.create_task(_big(port, stop, body.encode(), statuses)) for _ in range(big)]
    print("ATTACKING", flush=True)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return statuses


# -- the measuring side ---------------------------------------------------------------------------------


class Prober:
    """GET /v2/health/live every `every_s` on a fresh connection; keep each latency (None: failed)."""

    def __init__(self, port: int, every_s: float = 0.05) -> None:
        self.port, self.every_s = port, every_s
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            asked = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/live", timeout=10) as r:
                    r.read()
                    ok = r.status == 200
            except OSError:
                ok = False
            if ok:
                self.latencies.append(time.perf_counter() - asked)
            else:
                self.failures += 1

    def summary(self) -> str:
        if not self.latencies:
            return f"no answer ({self.failures} failures)"
        ms = sorted(x * 1000 for x in self.latencies)
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        return (
            f"p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms "
            f"({len(ms)} probes, {self.failures} failed)"
        )

    def p99_ms(self) -> float:
        ms = sorted(x * 1000 for x in self.latencies)
        return ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("inf")


def metrics(port: int) -> dict[str, float]:
    """The server's counters this benchmark reads, summed over labels but `reason`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("flightdeck_connections_closed_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = found.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("flightdeck_event_loop_lag_max_seconds"):
            found["lag_max_s"] = max(found.get("lag_max_s", 0.0), float(line.rsplit(" ", 1)[1]))
    return found


def worker_rss_mib(master: int) -> dict[int, float]:
    """Resident memory of each worker (the master's children), MiB."""
    rss = {}
    for pid in tree_cpu_by_pid(master):
        if pid == master:
            continue
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss[pid] = int(line.split()[1]) / 1024
        except FileNotFoundError:
            continue
    return rss


def load(port: int, concurrency: int, seconds: float) -> Result:
    return drive(
        port, "/v2/models/mlp/infer", MLP_BODY.encode(), concurrency, 1.0, seconds, lambda: {"t": time.perf_counter()}
    )


def fivexx(result: Result) -> int:
    return sum(n for status, n in result.total.items() if status >= 500)


def run(args: argparse.Namespace) -> int:
    folder = Path(tempfile.mkdtemp(prefix="flightdeck-hostile-"))
    home = folder / "home"
    timeout = str(args.timeout)
    overrides = {
        "FLIGHTDECK_WORKERS": str(args.workers),
        "FLIGHTDECK_HEADER_TIMEOUT_S": timeout,
        "FLIGHTDECK_BODY_TIMEOUT_S": timeout,
        "FLIGHTDECK_LOG_SAMPLE_RATE": "0",
        "GUNICORN_CMD_ARGS": f"--worker-connections {args.worker_connections}",
    }
    server = start_flightdeck(home, overrides)
    try:
        server.wait_ready()
        wait_all_workers(server, home)
        port = server.port
        print(f"Flightdeck on 127.0.0.1:{port}, {args.workers} worker(s), header/body timeouts {timeout} s, "
              f"worker_connections {args.worker_connections}; {os.cpu_count()} cores, shared with other work")  # fmt: skip
        load(port, args.concurrency, 2.0)  # warm-up: JIT-free, but caches, arenas and connections settle
        rss_before = worker_rss_mib(server.process.pid)
        closed_before = metrics(port)
        with Prober(port) as clean_probes:
            clean = load(port, args.concurrency, args.seconds)
        argv = [sys.executable, "-m", "bench.hostile", "--attack", str(port), "--slowloris", str(args.slowloris),
                "--stalled", str(args.stalled), "--flask-stalled", str(args.flask_stalled), "--big", str(args.big)]  # fmt: skip
        attacker = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert attacker.stdout is not None and attacker.stdin is not None
            assert attacker.stdout.readline().strip() == "ATTACKING"
            time.sleep(args.timeout + 1)  # NOTE: the attack at full strength: every kind of connection open
            with Prober(port) as attacked_probes:
                attacked = load(port, args.concurrency, args.seconds)
            rss_attacked = worker_rss_mib(server.process.pid)
            lag = metrics(port).get("lag_max_s", 0.0)
        finally:
            if attacker.stdin is not None:
                attacker.stdin.close()
            attacker.wait(60)
        big_statuses = json.loads(attacker.stdout.read() or "{}")
        time.sleep(args.timeout + 2)  # the last stalled connections reach their deadline
        rss_after = worker_rss_mib(server.process.pid)
        closed = {k: v - closed_before.get(k, 0.0) for k, v in metrics(port).items() if k != "lag_max_s"}
    finally:
        server.stop()
    shutil.rmtree(folder, ignore_errors=True)  # NOTE: only after a whole run; a failed one leaves its log there
    clean_rps = clean.statuses.get(200, 0) / clean.seconds
    attacked_rps = attacked.statuses.get(200, 0) / attacked.seconds
    print(f"\ninference (mlp, {args.concurrency} keep-alive clients, {args.seconds:g} s windows)")
    print(f"  clean:    {clean_rps:8.0f} req/s   5xx {fivexx(clean)}")
    print(
        f"  attacked: {attacked_rps:8.0f} req/s   5xx {fivexx(attacked)}   ratio {attacked_rps / clean_rps:.2f} (goal >= 0.90)"
    )
    print("/v2/health/live, a fresh connection every 50 ms")
    print(f"  clean:    {clean_probes.summary()}")
    print(f"  attacked: {attacked_probes.summary()}   (goal p99 < 50 ms)")
    print(f"  loop lag, worst second while attacked: {lag * 1000:.1f} ms")
    for pid in rss_before:
        print(f"worker {pid} RSS: before {rss_before[pid]:.0f} MiB, attacked {rss_attacked.get(pid, 0):.0f} MiB, "
              f"after {rss_after.get(pid, 0):.0f} MiB (goal: after within 64 MiB of before)")  # fmt: skip
    print("connections closed: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(closed.items())))
    print(f"attack: {args.slowloris} slowloris heads, {args.stalled} stalled /v2 bodies, {args.flask_stalled} stalled "
          f"Flask bodies, {args.big} senders of 16 MB BYTES bodies (answers: {big_statuses})")  # fmt: skip
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=12.0, help="each load window")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3.0, help="FLIGHTDECK_HEADER_TIMEOUT_S and BODY_TIMEOUT_S")
    p.add_argument("--worker-connections", type=int, default=200)
    p.add_argument("--slowloris", type=int, default=250)
    p.add_argument("--stalled", type=int, default=20)
    p.add_argument("--flask-stalled", type=int, default=8)
    p.add_argument("--big", type=int, default=2)
    p.add_argument("--attack", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the attacker process
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.attack:
        statuses = uvloop.run(attack(args.attack, args.slowloris, args.stalled, args.flask_stalled, args.big))
        print(json.dumps(statuses), flush=True)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
