"""The ASGI front (controlplane.asgi): inference answered on the event loop exactly as the Flask view answers it.

Each comparison sends one request through the front, in process (an ASGI call on a real event loop,
the real engine and its batcher threads), and the same request straight to Flask, and compares
status, headers and body byte for byte. Requests the front leaves to Flask go through a2wsgi.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from dataclasses import dataclass

import numpy as np
import pytest
from flask import Flask, request
from werkzeug.test import Client

from controlplane.asgi import Front
from controlplane.auth import Role
from tests.aio import run_async
from tests.controlplane.conftest import token_for
from tests.controlplane.test_inference_api import MLP, binary_body, mlp_array, mlp_body

REQUEST_ID = "asgi-test-1"


@pytest.fixture(autouse=True)
def quick_warmup(app_config: dict) -> None:
    app_config["warmup_max_sequence"] = 16


@pytest.fixture
def flask_requests(app: Flask) -> list[str]:
    """The paths of the requests Flask itself handled (its before_request hooks ran for them)."""
    seen: list[str] = []

    @app.before_request
    def _count() -> None:
        seen.append(request.path)

    return seen


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def asgi_call(front: Front, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *,
              method: str = "POST", chunks: list[bytes] | None = None) -> Reply:  # fmt: skip
    """Send one request through the front on an event loop; `chunks`: a body without Content-Length."""
    return run_async(lambda: _asgi(front, path, body, headers or {}, method, chunks))


async def _asgi(front, path, body, headers, method, chunks) -> Reply:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    if chunks is None:
        chunks = [body]
        raw.append((b"content-length", str(len(body)).encode()))
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": raw,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    await front(scope, receive, send)
    start = sent[0]
    assert start["type"] == "http.response.start"
    headers_out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]]
    return Reply(start["status"], headers_out, b"".join(m.get("body", b"") for m in sent[1:]))


def straight_to_flask(app: Flask, path: str, data: bytes, headers: dict[str, str], chunked: bool = False) -> Reply:
    response = Client(app.wsgi_app).post(
        path,
        input_stream=io.BytesIO(data) if chunked else None,
        data=None if chunked else data,
        headers=headers,
        environ_overrides={"wsgi.input_terminated": True} if chunked else None,
    )
    return Reply(response.status_code, list(response.headers.items()), response.get_data())


def both(app: Flask, path: str, data: bytes, headers: dict[str, str], chunked: bool = False) -> tuple[Reply, Reply]:
    """Send one request through the front and straight to Flask; return both answers."""
    headers = {"X-Request-ID": REQUEST_ID, "Content-Type": "application/json", **headers}
    front = asgi_call(Front(app), path, data, headers, chunks=[data[:10], data[10:]] if chunked else None)
    return front, straight_to_flask(app, path, data, headers, chunked)


def assert_same(front: Reply, flask: Reply) -> None:
    assert (front.status, front.headers, front.body) == (flask.status, flask.headers, flask.body)


def test_plain_inference_requests_skip_flask(app: Flask, flask_requests: list[str]) -> None:
    front = Front(app)
    body = json.dumps(mlp_body(1)).encode()
    plain = asgi_call(front, f"{MLP}/infer", body)
    versioned = asgi_call(front, f"{MLP}/versions/1/infer", body)
    assert plain.status == versioned.status == 200
    assert versioned.header("X-Model-Version") == "1"
    assert len(plain.header("X-Request-ID") or "") == 32  # generated here, as the app's hook would
    assert np.asarray(plain.json()["outputs"][0]["data"]).shape == (10,)
    assert flask_requests == []
    assert asgi_call(front, MLP, method="GET").status == 200  # metadata is Flask's, through a2wsgi
    assert asgi_call(front, f"{MLP}/infer/", body).status == 404  # not the view's rule: Flask's answer
    assert flask_requests == [MLP, f"{MLP}/infer/"]


def binary_mlp() -> tuple[bytes, dict[str, str]]:
    return binary_body(
        [("input", "FP32", mlp_array(2))], outputs=[{"name": "output", "parameters": {"binary_data": True}}]
    )


@pytest.mark.parametrize(
    "path, body, headers",
    [
        (f"{MLP}/infer", json.dumps(mlp_body(2, id="a")).encode(), {}),
        (f"{MLP}/versions/1/infer", json.dumps(mlp_body(1)).encode(), {"X-Route-Key": "user-7"}),
        (f"{MLP}/infer", *binary_mlp()),
        ("/v2/models/nope/infer", json.dumps(mlp_body(1)).encode(), {}),  # 404
        (f"{MLP}/versions/9/infer", json.dumps(mlp_body(1)).encode(), {}),  # 404
        (f"{MLP}/infer", b'{"inputs": [', {}),  # malformed JSON: 400
        (f"{MLP}/infer", json.dumps(mlp_body(1)).encode(), {"Inference-Header-Content-Length": "x"}),  # 400
        (f"{MLP}/infer", json.dumps({"inputs": [{"name": "input"}]}).encode(), {}),  # 400
    ],
    ids=["json", "version", "binary", "unknown-model", "unknown-version", "malformed", "header-length", "no-shape"],
)
def test_the_front_answers_as_the_flask_view(app: Flask, flask_requests: list[str], path, body, headers) -> None:
    front, flask = both(app, path, body, headers)
    assert_same(front, flask)
    assert front.header("X-Request-ID") == REQUEST_ID
    assert flask_requests == [path]  # only the second: the front answered the first itself


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_refused_alike(
    app_config: dict, request: pytest.FixtureRequest, chunked: bool
) -> None:
    app_config["max_request_bytes"] = 1024
    app = request.getfixturevalue("app")
    front, flask = both(app, f"{MLP}/infer", json.dumps(mlp_body(1)).encode(), {}, chunked=chunked)
    assert front.status == flask.status == 413
    assert front.json()["error"].startswith("request body")
    assert front.header("X-Request-ID") == flask.header("X-Request-ID") == REQUEST_ID


def test_an_unexpected_error_is_a_logged_500_in_the_protocols_form(
    app: Flask, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    # NOTE: a stand-in for a bug: nothing in the engine raises anything but a ServingError on purpose.
    engine = app.extensions["flightdeck"].engine
    monkeypatch.setattr(engine, "submit", broken)  # the front's way in
    monkeypatch.setattr(engine, "infer", broken)  # the Flask view's
    with caplog.at_level(logging.ERROR):
        front, flask = both(app, f"{MLP}/infer", json.dumps(mlp_body(1)).encode(), {})
    assert front.status == 500 and front.json() == {"error": "internal server error"}
    assert_same(front, flask)
    assert [r.name for r in caplog.records if r.exc_info] == ["controlplane.asgi", "controlplane.errorhandlers"]


def test_a_client_with_a_cookie_is_left_to_flask_which_reads_a_chunked_body(
    app: Flask, flask_requests: list[str]
) -> None:
    body = json.dumps(mlp_body(1)).encode()
    headers = {"Cookie": "unrelated=1", "Content-Type": "application/json"}
    reply = asgi_call(Front(app), f"{MLP}/infer", headers=headers, chunks=[body[:7], body[7:]])
    assert reply.status == 200, reply.body  # without wsgi.input_terminated Flask would read an empty body
    assert flask_requests == [f"{MLP}/infer"]


@pytest.fixture
def inference_needs_a_token(app_config: dict) -> None:
    app_config["inference_auth"] = True


@pytest.mark.usefixtures("inference_needs_a_token")
def test_with_inference_auth_flask_checks_the_token(app: Flask, flask_requests: list[str]) -> None:
    front = Front(app)
    body = json.dumps(mlp_body(1)).encode()
    refused = asgi_call(front, f"{MLP}/infer", body, {"Content-Type": "application/json"})
    assert refused.status == 401 and (refused.header("WWW-Authenticate") or "").startswith("Bearer")
    headers = {"Content-Type": "application/json", **token_for(app, "vic", Role.VIEWER)}
    granted = asgi_call(front, f"{MLP}/infer", body, headers)
    assert granted.status == 200
    outputs = granted.json()["outputs"]
    assert np.asarray(outputs[0]["data"]).size == outputs[0]["shape"][0] * outputs[0]["shape"][1]
    assert flask_requests == [f"{MLP}/infer", f"{MLP}/infer"]


@pytest.fixture
def one_executor(app_config: dict) -> None:
    app_config["batch_instances"] = 1


@pytest.mark.usefixtures("one_executor")
def test_a_request_still_queued_at_its_deadline_is_refused_then_and_never_run(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor is busy (it waits without a timeout then): only the front's own timer can refuse in time."""
    batcher = next(v.batcher for v in app.extensions["flightdeck"].engine.loaded("mlp"))
    run, started, gate, ran = batcher._run, threading.Event(), threading.Event(), []

    def gated(inputs):  # NOTE: holds the one executor inside the real model run until the test opens the gate
        ran.append(inputs["input"].copy())
        started.set()
        assert gate.wait(30)
        return run(inputs)

    monkeypatch.setattr(batcher, "_run", gated)
    front = Front(app)
    first = json.dumps(mlp_body(1)).encode()
    doomed = mlp_body(1)
    doomed["inputs"][0]["data"] = [42.0] * len(doomed["inputs"][0]["data"])
    doomed["parameters"] = {"timeout": 50_000}  # µs

    async def scenario() -> tuple[Reply, Reply]:
        busy = asyncio.create_task(_asgi(front, f"{MLP}/infer", first, {}, "POST", None))
        assert await asyncio.to_thread(started.wait, 10)
        refused = await _asgi(front, f"{MLP}/infer", json.dumps(doomed).encode(), {}, "POST", None)
        gate.set()
        return refused, await busy

    refused, served = run_async(scenario)
    assert refused.status == 504 and "not run" in refused.json()["error"]
    assert served.status == 200
    assert all(not np.any(batch == 42.0) for batch in ran) and len(ran) == 1


def test_a_client_gone_before_its_body_arrived_gets_no_answer_and_a_499_log_line(app: Flask) -> None:
    body = json.dumps(mlp_body(1)).encode()
    messages = [{"type": "http.request", "body": body[:20], "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": f"{MLP}/infer", "raw_path": f"{MLP}/infer".encode(), "query_string": b"", "root_path": "",
        "headers": [(b"x-request-id", b"gone-1")], "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    run_async(lambda: Front(app)(scope, receive, send))
    assert sent == []
    log_file = app.extensions["flightdeck"].settings.log_dir / "requests.log"
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    gone = [line for line in lines if line["request_id"] == "gone-1"]
    assert len(gone) == 1 and gone[0]["status"] == 499 and "closed the connection" in gone[0]["error"]


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready"])
def test_probes_are_answered_on_the_loop_as_flask_answers_them(app: Flask, flask_requests: list[str], path) -> None:
    headers = {"X-Request-ID": REQUEST_ID}
    front = asgi_call(Front(app), path, headers=headers, method="GET")
    response = Client(app.wsgi_app).get(path, headers=headers)
    flask = Reply(response.status_code, list(response.headers.items()), response.get_data())
    assert_same(front, flask)
    assert flask_requests == [path]  # only the direct call: the front answered its own
    app.extensions["flightdeck"].engine.begin_drain()
    assert asgi_call(Front(app), "/v2/health/ready", method="GET").json() == {"ready": False}
