"""Slow and hostile clients against the real server (issue 29): connection deadlines, room past the limit,
probes on the loop, big bodies decoded off it, login CSRF, and malformed input that must be a 400.

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

from controlplane.auth.bootstrap import INITIAL_ADMIN, PASSWORD_FILE
from tests.conftest import copy_home
from tests.controlplane.test_server import metric
from tests.servers import Server, start_server, wait_until

pytestmark = pytest.mark.slow

HEADER_S, BODY_S, SEND_S, KEEPALIVE_S, THREADS, CONNECTIONS = 1.0, 1.5, 2.0, 1.0, 2, 24


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
            "FLIGHTDECK_LOG_SAMPLE_RATE": "1",
            "FLIGHTDECK_MAX_QUEUE_SIZE": "1",  # so that 2 Flask threads are allowed
            "FLIGHTDECK_MAX_BATCH_SIZE": "1",
            "FLIGHTDECK_HEADER_TIMEOUT_S": str(HEADER_S),
            "FLIGHTDECK_BODY_TIMEOUT_S": str(BODY_S),
            "FLIGHTDECK_BODY_MIN_RATE": "1000",
            "FLIGHTDECK_SEND_TIMEOUT_S": str(SEND_S),
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


def cookie_of(headers: dict[str, str]) -> str | None:
    """The cookie a response set (name=value), or None."""
    value = next((v for k, v in headers.items() if k.lower() == "set-cookie"), None)
    return None if value is None else value.split(";")[0]


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


def hold_answers_unread(server: Server, count: int) -> list[socket.socket]:
    """Ask for plotly.js (4.6 MB, a file Flask streams from a thread) twice on `count` connections that never read.

    A receive buffer of 4 KiB keeps the client's kernel from taking the file in. The server's send buffer
    may grow to 4 MiB (tcp_wmem) and take in most of one answer; it cannot take two, so each connection's
    second answer, at the latest, waits on the client, and with it the Flask thread streaming the file.
    """
    host, port = server.url.removeprefix("http://").split(":")
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect((host, int(port)))
        sock.sendall(b"GET /assets/plotly.min.js HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
        held.append(sock)
    return held


def test_a_client_that_stops_reading_its_answer_is_cut_off_at_the_send_deadline_freeing_the_thread(
    slow_server: Server,
) -> None:
    before = closed_by(slow_server, "send_timeout")
    held = hold_answers_unread(slow_server, THREADS)
    try:
        started = time.monotonic()
        # Both Flask threads wait on clients that do not read; the next Flask route gets one at the deadline.
        status, body = slow_server.get("/v2")
        assert status == 200 and body["name"] == "flightdeck"
        assert SEND_S * 0.9 <= time.monotonic() - started < SEND_S + 3
        # The first abort frees the thread that answered /v2: the second may be counted a moment after that answer.
        wait_until(lambda: closed_by(slow_server, "send_timeout") >= before + THREADS, 5, "both aborts counted")
        assert closed_by(slow_server, "send_timeout") == before + THREADS
        for sock in held:
            received = read_all(sock)  # what the server had sent before the deadline, then the abort
            assert received.startswith(b"HTTP/1.1 200 ") and len(received) < 4_000_000
    finally:
        for sock in held:
            sock.close()


def test_a_client_that_hangs_up_on_pipelined_downloads_frees_the_threads_at_once(slow_server: Server) -> None:
    held = hold_answers_unread(slow_server, THREADS)
    for sock in held:
        assert sock.recv(64).startswith(b"HTTP/1.1 200 ")  # the first answer is being streamed
        sock.close()
    started = time.monotonic()
    # NOTE: before, uvicorn told only the newest (pipelined) request that the client left: the answer being
    # streamed went on writing to the closed connection and its Flask thread was held for ever.
    status, body = slow_server.get("/v2")
    assert status == 200 and body["name"] == "flightdeck"
    assert time.monotonic() - started < SEND_S  # not freed by the send deadline: by the hang-up itself


def test_a_client_that_waits_for_100_continue_is_not_late_while_its_request_waits_for_a_thread(
    slow_server: Server,
) -> None:
    held = hold_answers_unread(slow_server, THREADS)  # every Flask thread busy for SEND_S > BODY_S
    try:
        with connect(slow_server) as sock:
            body = b'{"name": "nobody", "password": "wrong-password"}'
            sock.sendall(
                b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            asked = time.monotonic()
            interim = sock.recv(65536)  # the server asks for the body once a thread reads it, after SEND_S
            assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim[:200]
            assert time.monotonic() - asked > BODY_S  # the body deadline would have ended it by now
            sock.sendall(body)
            answer = interim[len(b"HTTP/1.1 100 Continue\r\n\r\n") :] or sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    finally:
        for sock in held:
            sock.close()


def test_a_body_over_the_limit_gets_its_413_while_the_client_is_still_sending(slow_server: Server) -> None:
    with connect(slow_server) as sock:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (64 * 1024 * 1024)
        )
        sent = 0
        try:
            for _ in range(128):  # 8 MiB after the refusal, past both buffers: dropped, not reset
                sock.sendall(b" " * 65536)
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_all(sock)
    assert sent == 128  # a client library whose send is reset never reads the answer
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"is over the limit of" in answer, answer


def test_a_client_that_never_sends_the_body_it_announced_with_100_continue_gets_408(slow_server: Server) -> None:
    with connect(slow_server) as sock:
        sock.sendall(
            b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 40\r\n\r\n"
        )
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 408 "), answer[:200]


def test_a_body_sent_after_its_answer_leaves_an_idle_connection_that_is_closed(slow_server: Server) -> None:
    with connect(slow_server) as sock:
        # Refused before the body is read (no session), so no 100 Continue; the client sends the body anyway.
        sock.sendall(
            b"POST /api/users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        sock.sendall(b"{}")
        sent = time.monotonic()
        rest = read_all(sock)
    assert b"HTTP/1.1" not in rest  # nothing more is answered: the body was the refused request's
    assert time.monotonic() - sent < max(KEEPALIVE_S, BODY_S) + 3


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


def bytes_body(count: int) -> bytes:
    request = {"inputs": [{"name": "input", "shape": [count], "datatype": "BYTES", "data": [""] * count}]}
    return json.dumps(request, separators=(",", ":")).encode()


def test_millions_of_tiny_values_are_refused_before_parsing(slow_server: Server) -> None:
    asked = time.monotonic()
    status, answer, _ = slow_server.post("/v2/models/mlp/infer", bytes_body(2_000_000), timeout=60)
    assert status == 413 and "FLIGHTDECK_MAX_REQUEST_VALUES" in answer["error"], answer
    assert time.monotonic() - asked < 5


def test_a_big_body_is_decoded_off_the_loop_so_probes_stay_prompt(slow_server: Server) -> None:
    body = bytes_body(1_000_000)  # just under the values' limit: about a second of decoding in Python
    answered: list[int] = []

    def send() -> None:
        for _ in range(2):
            answered.append(slow_server.post("/v2/models/mlp/infer", body, timeout=60)[0])

    sender = threading.Thread(target=send)
    sender.start()
    probes: list[float] = []
    while sender.is_alive():
        asked = time.monotonic()
        assert slow_server.get("/v2/health/live")[0] == 200
        probes.append(time.monotonic() - asked)
    sender.join()
    assert answered == [400, 400]  # mlp takes FP32: refused once decoded
    assert len(probes) > 5, probes
    assert max(probes) < 0.5, sorted(probes)[-5:]
    lag = wait_until(lambda: metric(slow_server.metrics(), "flightdeck_event_loop_lag_seconds_count"), 5, "lag")
    assert lag > 0


def test_a_cross_site_login_is_refused_and_sets_no_cookie(slow_server: Server) -> None:
    login = {"name": INITIAL_ADMIN, "password": (slow_server.home / PASSWORD_FILE).read_text().strip()}
    # What a cross-site HTML form can send without a CORS preflight: text/plain holding JSON.
    as_form = {"Content-Type": "text/plain", "Origin": "null"}
    status, body, headers = slow_server.post("/api/session", json.dumps(login).encode(), as_form)
    assert status in (403, 415) and cookie_of(headers) is None
    status, body, headers = slow_server.post("/api/session", json.dumps(login).encode(), {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]["message"] and cookie_of(headers) is None
    for elsewhere in (
        {"Origin": "https://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": slow_server.url},  # a sibling host of the same site
    ):
        status, body, headers = slow_server.post("/api/session", login, elsewhere)
        assert status == 403, (elsewhere, status, body)
        assert "cross-site" in body["error"]["message"] and cookie_of(headers) is None
    status, body, headers = slow_server.post(
        "/api/session", login, {"Origin": slow_server.url, "Sec-Fetch-Site": "same-origin"}
    )
    assert status == 200 and cookie_of(headers) is not None
    # Every cookie-authenticated write: the same rule, even with the session's CSRF token.
    cookie = {"Cookie": cookie_of(headers), "X-CSRF-Token": body["csrf_token"]}
    user = {"name": "eve", "password": "a-long-password-1", "role": "viewer"}
    status, body, _ = slow_server.post("/api/users", user, {**cookie, "Origin": "https://attacker.example"})
    assert status == 403 and "cross-site" in body["error"]["message"]
    status, _, _ = slow_server.post("/api/users", json.dumps(user).encode(), {**cookie, "Content-Type": "text/plain"})
    assert status == 415
    status, body, _ = slow_server.post("/api/users", user, {**cookie, "Origin": slow_server.url})
    assert status == 201, body


def test_malformed_input_is_a_400_with_a_message_on_both_paths(slow_server: Server) -> None:
    ones = json.dumps([0.5] * 64)
    cases = {
        "65 dimensions": b'{"inputs": [{"name": "input", "shape": %s, "datatype": "FP32", "data": [1.0]}]}'
        % json.dumps([1] * 65).encode(),
        "a lone surrogate as a name": b'{"inputs": [{"name": "\\ud800", "shape": [1, 64], "datatype": "FP32", '
        b'"data": %s}]}' % ones.encode(),
        "a lone surrogate, miscounted": b'{"inputs": [{"name": "\\ud800", "shape": [1, 64], "datatype": "FP32", '
        b'"data": [0.5]}]}',
        "a dimension of 1e30": b'{"inputs": [{"name": "input", "shape": [0, %d], "datatype": "FP32", "data": []}]}'
        % 10**30,
        "a dimension of 1e30 as a float": b'{"inputs": [{"name": "input", "shape": [0, 1e30], "datatype": "FP32", '
        b'"data": []}]}',
    }
    for what, body in cases.items():
        for extra in ({}, {"Cookie": "unrelated=1"}):  # on the event loop, and through Flask
            status, answer, _ = slow_server.post("/v2/models/mlp/infer", body, extra)
            assert status == 400, (what, extra, status, answer)
            assert answer["error"], what
    login = {"name": INITIAL_ADMIN, "password": (slow_server.home / PASSWORD_FILE).read_text().strip()}
    status, who, headers = slow_server.post("/api/session", login)
    cookie = {"Cookie": cookie_of(headers), "X-CSRF-Token": who["csrf_token"]}
    status, answer, _ = slow_server.post("/api/users", b"[" * 5000 + b"]" * 5000, cookie)
    assert status == 400 and "JSON" in answer["error"]["message"], (status, answer)
    log = slow_server.output()
    assert "Traceback" not in log and "Logging error" not in log, log[-3000:]
