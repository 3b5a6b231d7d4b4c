"""Slow and hostile clients against the real server (issue 29): each connection deadline, room past the limit, probes.

One server with its limits lowered (1-2 s deadlines, 2 Flask threads, 24 connections) serves the whole
module. The clients here pace their bytes on purpose: that pacing is the behaviour under test.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import copy_home
from tests.controlplane.test_server import metric
from tests.servers import Server, start_server, wait_until

pytestmark = pytest.mark.slow

HEADER_S, BODY_S, KEEPALIVE_S, THREADS, CONNECTIONS = 1.0, 1.5, 1.0, 2, 24


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator[Server]:
    home = copy_home(template_home, tmp_path_factory.mktemp("deadlines") / "home")
    server = start_server(
        home,
        {
            "FLIGHTDECK_WORKERS": "1",
            "FLIGHTDECK_THREADS": str(THREADS),
            "FLIGHTDECK_LOAD_MODELS": "mlp",
            "FLIGHTDECK_SCHEDULER": "false",
            "FLIGHTDECK_MAX_QUEUE_SIZE": "1",  # so that 2 Flask threads are allowed
            "FLIGHTDECK_MAX_BATCH_SIZE": "1",
            "FLIGHTDECK_HEADER_TIMEOUT_S": str(HEADER_S),
            "FLIGHTDECK_BODY_TIMEOUT_S": str(BODY_S),
            "FLIGHTDECK_BODY_MIN_RATE": "1000",
            "FLIGHTDECK_KEEPALIVE_TIMEOUT_S": str(KEEPALIVE_S),
            "GUNICORN_CMD_ARGS": f"--worker-connections {CONNECTIONS}",
        },
    )
    yield server
    assert server.stop() == 0
    assert "Traceback" not in server.output()


def connect(server: Server, timeout: float = 10) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    try:
        while piece := sock.recv(65536):
            answer += piece
    except ConnectionResetError:
        pass
    return answer


def closed_by(server: Server, reason: str) -> float:
    return metric(server.metrics(), "flightdeck_connections_closed_total", reason=reason)


def test_a_silent_connection_is_closed_at_the_header_deadline(slow_server: Server) -> None:
    before = closed_by(slow_server, "header_timeout")
    started = time.monotonic()
    with connect(slow_server) as sock:
        assert read_all(sock) == b""  # nothing was asked: nothing is answered
    waited = time.monotonic() - started
    assert HEADER_S * 0.9 <= waited < HEADER_S + 3, waited
    assert closed_by(slow_server, "header_timeout") == before + 1


def test_a_dripping_head_gets_408_at_the_header_deadline_however_it_keeps_sending(slow_server: Server) -> None:
    started = time.monotonic()
    with connect(slow_server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(0.1)
        answer = b""
        while not answer and time.monotonic() - started < HEADER_S + 5:
            try:
                sock.sendall(b"X-Drip: a\r\n")  # a header line every 0.1 s: never complete
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"did not arrive within" in answer
    assert HEADER_S * 0.9 <= waited < HEADER_S + 3, waited


def test_a_stalled_inference_body_gets_408_and_its_memory_back(slow_server: Server) -> None:
    before = closed_by(slow_server, "body_timeout")
    started = time.monotonic()
    with connect(slow_server) as sock:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"inputs": [' + b" " * 20000
        )
        answer = read_all(sock)
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"stopped arriving" in answer
    assert BODY_S * 0.9 <= waited < BODY_S + 3, waited
    assert closed_by(slow_server, "body_timeout") == before + 1
    lines = [json.loads(line) for line in (slow_server.home / "logs" / "requests.log").read_text().splitlines()]
    assert any(line.get("status") == 408 and line.get("model") == "mlp" for line in lines)


def test_a_body_dripped_below_the_minimum_rate_is_ended_however_it_keeps_sending(slow_server: Server) -> None:
    started = time.monotonic()
    with connect(slow_server) as sock:
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        sock.settimeout(0.2)
        answer = b""
        while not answer and time.monotonic() - started < BODY_S + 8:
            try:
                sock.sendall(b" ")  # 5 bytes a second: never idle for BODY_S, far below 1000 bytes a second
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert time.monotonic() - started < BODY_S + 4


def test_stalled_bodies_hold_flask_threads_only_until_the_body_deadline_and_probes_never_wait(
    slow_server: Server,
) -> None:
    stalled = []
    for _ in range(THREADS + 2):
        sock = connect(slow_server)
        sock.sendall(
            b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"name": "'
        )
        stalled.append(sock)
    try:
        started = time.monotonic()
        # Every Flask thread now waits for a body that does not come; the probes are answered on the loop.
        for path in ("/v2/health/live", "/v2/health/ready"):
            asked = time.monotonic()
            assert slow_server.get(path)[0] == 200
            assert time.monotonic() - asked < BODY_S / 2
        status, body = slow_server.get("/v2")  # a Flask route: it waits for a thread, which the deadline frees
        assert status == 200 and body["name"] == "flightdeck"
        assert time.monotonic() - started < BODY_S + 3
        for sock in stalled:
            assert read_all(sock).startswith(b"HTTP/1.1 408 ")
    finally:
        for sock in stalled:
            sock.close()


def test_an_idle_keep_alive_connection_is_closed(slow_server: Server) -> None:
    before = closed_by(slow_server, "keepalive_timeout")
    with connect(slow_server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answered = time.monotonic()
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"live": true}')
    assert KEEPALIVE_S * 0.9 <= time.monotonic() - answered < KEEPALIVE_S + 3
    assert closed_by(slow_server, "keepalive_timeout") == before + 1


def test_past_the_connection_limit_idle_connections_make_room_for_working_clients(slow_server: Server) -> None:
    before = closed_by(slow_server, "evicted")
    idle = [connect(slow_server) for _ in range(CONNECTIONS + 10)]
    try:
        # NOTE: all opened well within HEADER_S; the deadline has not closed them, the limit does.
        assert slow_server.get("/v2/health/live")[0] == 200
        status, _, _ = slow_server.post(
            "/v2/models/mlp/infer",
            {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]},
        )
        assert status == 200
        assert closed_by(slow_server, "evicted") >= before + 10
    finally:
        for sock in idle:
            sock.close()


def test_a_huge_bytes_body_is_decoded_off_the_loop_so_probes_stay_prompt(slow_server: Server) -> None:
    count = 2_000_000  # about 8 MB of empty strings: seconds of decoding in Python
    body = json.dumps({"inputs": [{"name": "input", "shape": [count], "datatype": "BYTES", "data": [""] * count}]})
    answered: list[int] = []

    def send() -> None:
        answered.append(slow_server.post("/v2/models/mlp/infer", body.encode(), timeout=60)[0])

    sender = threading.Thread(target=send)
    sender.start()
    probes: list[float] = []
    while sender.is_alive():
        asked = time.monotonic()
        assert slow_server.get("/v2/health/live")[0] == 200
        probes.append(time.monotonic() - asked)
    sender.join()
    assert answered == [400]  # mlp takes FP32: refused once decoded
    assert len(probes) > 5, probes
    assert max(probes) < 0.5, sorted(probes)[-5:]
    lag = wait_until(lambda: metric(slow_server.metrics(), "flightdeck_event_loop_lag_seconds_count"), 5, "lag")
    assert lag > 0
