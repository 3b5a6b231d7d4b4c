"""bench.loadgen against a real HTTP server on 127.0.0.1: exact counts, 429s, dropped and closed connections."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bench.loadgen import Connection, Recorder, drive
from bench.process import free_port
from tests.aio import run_async

BODY = b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
ANSWER = b'{"outputs":[{"name":"y","shape":[1,1],"datatype":"FP32","data":[10]}]}'


class CountingServer(ThreadingHTTPServer):
    """Answers by request number: 200s (some split byte by byte, some closing), 429s, dropped connections."""

    daemon_threads = True
    request_queue_size = 64  # every connection of the load generator at once

    def __init__(self) -> None:
        self.answered: Counter[int] = Counter()  # 0: closed without an answer
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), Handler)

    def next_answer(self, body: bytes) -> tuple[int, int]:
        """Count and return (status, request number)."""
        with self.lock:
            n = sum(self.answered.values())
            status = 400 if body != BODY else 429 if n % 6 == 1 else 0 if n % 6 == 3 else 200
            self.answered[status] += 1
            return status, n

    def snapshot(self) -> Counter[int]:
        with self.lock:
            return Counter(self.answered)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CountingServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one segment per write

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/no-length":
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + ANSWER)
            return
        status, n = self.server.next_answer(body)
        if status == 0:
            self.close_connection = True
            return
        close = status == 200 and n % 10 == 4
        head = f"HTTP/1.1 {status} X\r\nCONTENT-type: application/json\r\ncontent-LENGTH: {len(ANSWER)}\r\n"
        head += "Retry-After: 0\r\n" if status == 429 else ""
        head += "Connection: close\r\n" if close else ""
        response = (head + "\r\n").encode() + ANSWER
        self.close_connection = close
        if n % 6 == 5:  # split: the parser must wait for the rest
            for i in range(len(response)):
                self.wfile.write(response[i : i + 1])
        else:
            self.wfile.write(response)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[CountingServer]:
    srv = CountingServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def test_counts_match_what_the_server_answered(server: CountingServer) -> None:
    """Every answer, 429 and dropped connection of the run is counted once; the window is inside the run."""
    port = server.server_address[1]
    seconds = 1.0

    def probe() -> dict[str, Any]:
        return {"t": time.perf_counter(), "answered": server.snapshot()}

    r = drive(port, "/infer", BODY, concurrency=4, warmup_s=0.1, seconds=seconds, probe=probe)
    assert r.total == server.snapshot()  # exactly what the server answered, split responses included
    assert set(r.total) == {0, 200, 429} and r.total[200] > 20
    assert set(r.statuses) == {0, 200, 429} and len(r.latencies) == r.statuses[200]
    assert all(r.statuses[s] <= r.total[s] for s in r.total)
    assert all(0 < lat < 5 for lat in r.latencies)
    # The window is the one the child measured, and the parent probed at its edges.
    # NOTE: bounds that hold on a starved 2-core machine too: a timer or a probe may run late, never early.
    assert seconds - 0.01 <= r.seconds <= seconds + 0.5
    assert abs(r.delta("t") - seconds) < 0.5
    in_window = r.after["answered"] - r.before["answered"]
    assert sum(in_window.values()) > 0.5 * sum(r.statuses.values())


def test_a_refused_connection_counts_as_status_0() -> None:
    r = drive(free_port(), "/infer", BODY, concurrency=1, warmup_s=0, seconds=0.1, probe=dict)
    assert set(r.statuses) == {0} and r.statuses[0] > 0 and r.latencies == []


def test_a_response_without_content_length_stops_the_run(server: CountingServer) -> None:
    with pytest.raises(RuntimeError, match="without Content-Length"):
        drive(server.server_address[1], "/no-length", BODY, concurrency=1, warmup_s=0.2, seconds=0.1, probe=dict)


class FakeTransport:
    """Records what the connection writes; close() reports the connection lost, as a transport does."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.protocol: Connection | None = None

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            self.closed = True
            self.protocol.connection_lost(None)


def test_responses_split_or_whole_are_parsed_one_at_a_time() -> None:
    """Byte by byte or in one piece, any header case: one count per response, then the request again."""

    async def scenario() -> tuple[Recorder, FakeTransport, float]:
        recorder, transport = Recorder(), FakeTransport()
        conn = Connection(b"REQUEST", recorder, set())
        transport.protocol = conn
        recorder.open = True
        conn.connection_made(transport)  # type: ignore[arg-type]
        ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
        for i in range(len(ok)):
            assert recorder.total[200] == 0
            conn.data_received(ok[i : i + 1])
        assert recorder.total == {200: 1} and len(transport.writes) == 2
        conn.data_received(b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 3\r\n\r\n")
        conn.data_received(b"abc")
        conn.data_received(b"HTTP/1.1 429 Too Many\r\nContent-Length: 0\r\nRetry-After: 0\r\n\r\n")
        assert len(transport.writes) == 4  # Retry-After 0: no wait
        conn.data_received(b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 1\r\n\r\nx")
        assert transport.closed and len(transport.writes) == 4
        return recorder, transport, await conn.closed

    recorder, transport, backoff = run_async(scenario)
    assert recorder.statuses == {200: 3, 429: 1} and len(recorder.latencies) == 3
    assert transport.writes == [b"REQUEST"] * 4 and backoff == 0.0


def test_a_connection_dropped_in_flight_counts_as_status_0_and_backs_off() -> None:
    async def scenario() -> tuple[Recorder, float]:
        recorder, transport = Recorder(), FakeTransport()
        conn = Connection(b"REQUEST", recorder, set())
        transport.protocol = conn
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-")  # half a head, then the server goes away
        transport.close()
        return recorder, await conn.closed

    recorder, backoff = run_async(scenario)
    assert recorder.total == {0: 1} and backoff > 0
