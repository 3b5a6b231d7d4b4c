"""A closed-loop HTTP/1.1 load generator in its own process, for `bench.peers`: `drive()` starts it.

Why a process of its own, on uvloop with `asyncio.Protocol` connections: the threaded http.client loop
(`bench.engine.closed_loop`) spends about 100-140 µs of client CPU per request plus GIL contention
between its threads, on the same 2 cores as the server under test; at c=32 on a light model the
client, not the server, set the req/s. This one pre-encodes the request once and parses only the
status line and three headers, per response, in one callback.

    python -m bench.loadgen --port P --path /v2/models/mlp/infer --concurrency 32 --warmup 1 --seconds 4 < body

The body comes on stdin; `concurrency` keep-alive connections to 127.0.0.1:P each POST it again as
soon as the previous response is whole (Content-Length framing). A 429/503 waits min(Retry-After, 0.05) s
on that connection first; `Connection: close` reconnects; a connection dropped with a request in
flight, or refused, counts as status 0 and reconnects 10 ms later.

Protocol on stdout, one line each, so the parent can probe the server exactly at the window's edges:
`START <t>` when the window opens (after the warm-up), `END <t>` when it closes (t: time.perf_counter,
CLOCK_MONOTONIC on Linux), then, once the requests in flight have been answered, one JSON object:
statuses and 200-latencies (s) of the responses that ended inside the window, its length, this
process's CPU seconds over it, and `total`: statuses of every response of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

ROOT = Path(__file__).resolve().parent.parent
SHED = (429, 503)
MAX_BACKOFF_S = 0.05  # at most this long on a 429/503, whatever its Retry-After says (as bench.Server's client)
RECONNECT_S = 0.01  # after a failed or refused connection, so a dead server is not hammered


@dataclass
class Result:
    """What the load generator saw: its window, and the parent's probes at the window's start and end."""

    statuses: Counter[int]  # responses that ended inside the window, 0: the connection failed
    latencies: list[float]  # seconds, the window's 200s
    seconds: float
    cpu_s: float  # the load generator's own CPU over the window
    total: Counter[int]  # every response of the run: warm-up, window and drain
    before: dict[str, Any]
    after: dict[str, Any]

    def delta(self, key: str) -> float:
        """Return after[key] - before[key]."""
        return self.after[key] - self.before[key]


def drive(
    port: int, path: str, body: bytes, concurrency: int, warmup_s: float, seconds: float,
    probe: Callable[[], dict[str, Any]], timeout_s: float = 120, generator: str = "bench.loadgen",
    extra: tuple[str, ...] = (),
) -> Result:  # fmt: skip
    """Run the load generator against 127.0.0.1:`port`, calling `probe` right as its window opens and closes.

    `generator` is this module, or one speaking its protocol on stdout (bench.grpcload); `extra`, more arguments.
    """
    argv = [sys.executable, "-m", generator, "--port", str(port), "--path", path, *extra]
    argv += ["--concurrency", str(concurrency), "--warmup", str(warmup_s), "--seconds", str(seconds)]
    child = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(body)
        child.stdin.close()
        # NOTE: each probe right after its line arrives: the child stops nothing to wait for us.
        _expect(child, child.stdout.readline(), b"START ")
        before = probe()
        _expect(child, child.stdout.readline(), b"END ")
        after = probe()
        line = child.stdout.read()  # NOTE: to the end: a result cut short shows as such, with the child's stderr
        _expect(child, line, b"{")
        child.wait(timeout_s)
        if child.returncode != 0 or not line.endswith(b"}\n"):
            err = child.stderr.read()  # type: ignore[union-attr]
            raise RuntimeError(
                f"bench.loadgen exited with {child.returncode} after {len(line)} bytes of its result; stderr:\n"
                f"{err.decode()[-4000:]}"
            )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()  # type: ignore[union-attr]
        child.stdout.close()  # type: ignore[union-attr]
    data = json.loads(line)
    return Result(
        Counter({int(s): n for s, n in data["statuses"].items()}), data["latencies"], data["seconds"], data["cpu_s"],
        Counter({int(s): n for s, n in data["total"].items()}), before, after,
    )  # fmt: skip


def _expect(child: subprocess.Popen[bytes], line: bytes, prefix: bytes) -> None:
    if not line.startswith(prefix):
        child.kill()
        err = child.stderr.read()  # type: ignore[union-attr]
        child.wait()
        raise RuntimeError(f"bench.loadgen said {line[:200]!r}, not {prefix!r}...; stderr:\n{err.decode()[-4000:]}")


def encode_request(port: int, path: str, body: bytes, header_length: int | None = None) -> bytes:
    """Return the whole HTTP/1.1 request, head and body, that every connection sends.

    `header_length`: the body is the binary tensor extension's, its JSON part this long.
    """
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    if header_length is not None:
        head += f"Inference-Header-Content-Length: {header_length}\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, int, bool, float]:
    """Return (status, body length, whether the server closes, Retry-After s) from a response head."""
    lines = head.split(b"\r\n")
    version, status = lines[0][:8], int(lines[0][9:12])
    length, close, retry_after = -1, version == b"HTTP/1.0", 1.0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() != b"keep-alive" if close else value.strip().lower() == b"close"
        elif name == b"retry-after":
            try:
                retry_after = float(value)
            except ValueError:
                pass  # an HTTP date: wait the most
    if length < 0:
        if status in (204, 304) or status < 200:
            length = 0
        else:  # NOTE: chunked or read-to-close bodies are not parsed; stop rather than mis-count
            raise ValueError(f"a {status} response without Content-Length: {head[:300]!r}")
    return status, length, close, retry_after


class Recorder:
    """Statuses and 200-latencies of the responses that end while the window is open, and of all of them."""

    def __init__(self) -> None:
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()  # a response we cannot parse
        self.open = False
        self.draining = False  # the window has closed: send nothing more
        self.statuses: Counter[int] = Counter()
        self.latencies: list[float] = []
        self.total: Counter[int] = Counter()

    def record(self, status: int, latency: float) -> None:
        """Count one response (status 0: the connection failed)."""
        self.total[status] += 1
        if self.open:
            self.statuses[status] += 1
            if status == 200:
                self.latencies.append(latency)

    def fail(self, message: str) -> None:
        """Stop the run: a count that went on would be wrong."""
        if not self.failed.done():
            self.failed.set_result(message)

    def result(self, window: tuple[float, float]) -> dict[str, Any]:
        """The JSON result: the window's statuses and latencies, its length and CPU, and every response's status."""
        seconds, cpu = window
        return {
            "statuses": self.statuses, "latencies": self.latencies, "seconds": seconds, "cpu_s": cpu,
            "total": self.total,
        }  # fmt: skip

    async def wait(self, seconds: float) -> None:
        """Sleep `seconds`; raise SystemExit at once if the run failed."""
        done, _ = await asyncio.wait([self.failed], timeout=seconds)
        if done:
            raise SystemExit(f"bench.loadgen: {self.failed.result()}")


class Connection(asyncio.Protocol):
    """One keep-alive connection that sends `request` again as soon as the previous response is whole."""

    def __init__(self, request: bytes, recorder: Recorder, live: set[Connection]) -> None:
        self.closed: asyncio.Future[float] = asyncio.get_running_loop().create_future()  # result: backoff s
        self._request, self._recorder, self._live = request, recorder, live
        self._buffer = bytearray()
        self._head: tuple[int, int, int, bool, float] | None = None  # status, body start, body end, close, retry
        self._sent_at: float | None = None  # a request is in flight
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._backoff = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._live.add(self)
        self.send()

    @property
    def in_flight(self) -> bool:
        """Whether a request waits for its response."""
        return self._sent_at is not None

    def send(self) -> None:
        """Send the request (nothing once the window has closed: the run is draining)."""
        self._timer = None
        if self._recorder.draining:
            self.close()
            return
        self._sent_at = time.perf_counter()
        self._transport.write(self._request)  # type: ignore[union-attr]

    def close(self) -> None:
        """Close the connection now, whatever is in flight."""
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                status, length, close, retry = parse_head(bytes(self._buffer[:end]))
            except ValueError as e:
                self._recorder.fail(str(e))
                self.close()
                return
            self._head = (status, end + 4, end + 4 + length, close, retry)
        status, _, body_end, close, retry = self._head
        if len(self._buffer) < body_end:
            return
        latency = time.perf_counter() - self._sent_at  # type: ignore[operator]
        self._sent_at, self._head = None, None
        del self._buffer[:body_end]
        self._recorder.record(status, latency)
        self._backoff = min(retry, MAX_BACKOFF_S) if status in SHED else 0.0
        if close or self._recorder.draining:
            self.close()
        elif self._backoff:
            self._timer = asyncio.get_running_loop().call_later(self._backoff, self.send)
        else:
            self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if self.in_flight:  # dropped with a request in flight
            self._recorder.record(0, time.perf_counter() - self._sent_at)
            self._backoff = RECONNECT_S
        self.closed.set_result(self._backoff)


async def keep_calling(port: int, request: bytes, recorder: Recorder, live: set[Connection]) -> None:
    """Open a connection and let it run; open another when it closes, until the window has closed."""
    loop = asyncio.get_running_loop()
    while not recorder.draining:
        try:
            _, conn = await loop.create_connection(lambda: Connection(request, recorder, live), "127.0.0.1", port)
            backoff = await conn.closed
        except OSError:
            recorder.record(0, 0.0)
            backoff = RECONNECT_S
        if backoff and not recorder.draining:
            await asyncio.sleep(backoff)


async def generate(
    port: int, path: str, body: bytes, concurrency: int, warmup_s: float, seconds: float, drain_s: float = 60,
    header_length: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Warm up, print START, record for `seconds`, print END, let the requests in flight finish; return the result."""
    recorder = Recorder()
    live: set[Connection] = set()
    request = encode_request(port, path, body, header_length)
    tasks = [asyncio.create_task(keep_calling(port, request, recorder, live)) for _ in range(concurrency)]
    window = await measure_window(recorder, warmup_s, seconds)
    for conn in list(live):
        if not conn.in_flight:
            conn.close()  # waiting out a backoff
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in pending:  # NOTE: a server that never answers: give up on those requests
        task.cancel()
    for conn in list(live):
        conn.close()
    await recorder.wait(0)  # a response it could not parse while draining: `total` would be wrong
    return recorder.result(window)


async def measure_window(recorder: Recorder, warmup_s: float, seconds: float) -> tuple[float, float]:
    """Warm up, open the window (START), record for `seconds`, close it (END); return its length and this process's CPU."""
    await recorder.wait(warmup_s)
    # NOTE: no callback runs between opening the window and reading the clocks: its edges are exact.
    recorder.open, start, cpu = True, time.perf_counter(), time.process_time()
    _say(f"START {start:.6f}")
    await recorder.wait(seconds)
    recorder.open, recorder.draining, end, cpu = False, True, time.perf_counter(), time.process_time() - cpu
    _say(f"END {end:.6f}")
    return end - start, cpu


def _say(line: str) -> None:
    # NOTE: uvloop leaves stdout non-blocking; the result line (every latency) can pass the pipe's 64 KiB, and a
    # partial write then cut it short whenever the parent was slow to read. Written with os.write until all of it
    # is out, waiting for the pipe whenever it is full, whatever mode the descriptor is in.
    sys.stdout.flush()
    fd = sys.stdout.fileno()
    os.set_blocking(fd, True)
    data = memoryview((line + "\n").encode())
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            select.select([], [fd], [])


def arguments(prog: str, doc: str, path: str | None = None) -> argparse.ArgumentParser:
    """The arguments every load generator speaking this protocol takes (`path`: the default of --path)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=path is None, default=path)
    p.add_argument("--concurrency", type=int, default=1, help="callers, one request in flight each")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before the window opens")
    p.add_argument("--seconds", type=float, default=4.0, help="the window's length")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one closed loop on the body read from stdin; print START, END and the JSON result."""
    p = arguments("python -m bench.loadgen", __doc__)
    p.add_argument("--header-length", type=int, help="the body is the binary tensor extension's, its JSON this long")
    args = p.parse_args(argv)
    body = sys.stdin.buffer.read()
    result = uvloop.run(
        generate(
            args.port, args.path, body, args.concurrency, args.warmup, args.seconds, header_length=args.header_length
        )
    )
    _say(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
