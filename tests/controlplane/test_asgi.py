"""The inference fast path: taken by plain inference requests, answering exactly as the Flask view would.

Each comparison sends one request twice through the same app, once through the fast path
(`app.wsgi_app`) and once straight to Flask (the wrapped callable, `app.wsgi_app.app`), and
compares status, headers and body byte for byte.
"""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest
from flask import Flask, request
from werkzeug.test import Client, TestResponse

from controlplane.auth import Role
from controlplane.fastpath import FastInfer
from tests.controlplane.conftest import token_for
from tests.controlplane.test_inference_api import MLP, binary_body, mlp_array, mlp_body

REQUEST_ID = "fastpath-test-1"


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


def both(app: Flask, path: str, data: bytes, headers: dict[str, str], **environ) -> tuple[TestResponse, TestResponse]:
    """Send one request through the fast path and straight to Flask; return both answers."""
    assert isinstance(app.wsgi_app, FastInfer)
    answers = []
    for wsgi in (app.wsgi_app, app.wsgi_app.app):
        answers.append(
            Client(wsgi).post(
                path,
                input_stream=io.BytesIO(data) if environ.get("chunked") else None,
                data=None if environ.get("chunked") else data,
                headers={"X-Request-ID": REQUEST_ID, "Content-Type": "application/json", **headers},
                environ_overrides={"wsgi.input_terminated": True} if environ.get("chunked") else None,
            )
        )
    return answers[0], answers[1]


def assert_same(fast: TestResponse, flask: TestResponse) -> None:
    assert fast.status == flask.status
    assert list(fast.headers.items()) == list(flask.headers.items())
    assert fast.get_data() == flask.get_data()


def test_plain_inference_requests_skip_flask(client, flask_requests: list[str]) -> None:
    response = client.post(f"{MLP}/infer", json=mlp_body(1))
    versioned = client.post(f"{MLP}/versions/1/infer", json=mlp_body(1))
    assert response.status_code == versioned.status_code == 200
    assert versioned.headers["X-Model-Version"] == "1"
    assert len(response.headers["X-Request-ID"]) == 32  # generated here, as the app's hook would
    assert flask_requests == []
    assert client.get(MLP).status_code == 200  # metadata is Flask's
    assert client.post(f"{MLP}/infer/", json=mlp_body(1)).status_code == 404  # not the view's rule: Flask's answer
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
def test_the_fast_path_answers_as_the_flask_view(app: Flask, flask_requests: list[str], path, body, headers) -> None:
    fast, flask = both(app, path, body, headers)
    assert_same(fast, flask)
    assert fast.headers["X-Request-ID"] == REQUEST_ID
    assert flask_requests == [path]  # the first went by the fast path


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_refused_alike(
    app_config: dict, request: pytest.FixtureRequest, chunked: bool
) -> None:
    app_config["max_request_bytes"] = 1024
    app = request.getfixturevalue("app")
    fast, flask = both(app, f"{MLP}/infer", json.dumps(mlp_body(1)).encode(), {}, chunked=chunked)
    assert fast.status_code == 413
    assert_same(fast, flask)


def test_an_unexpected_error_is_a_logged_500_in_the_protocols_form(
    app: Flask, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    # NOTE: a stand-in for a bug: nothing in the engine raises anything but a ServingError on purpose.
    monkeypatch.setattr(app.extensions["flightdeck"].engine, "infer", broken)
    with caplog.at_level(logging.ERROR):
        fast, flask = both(app, f"{MLP}/infer", json.dumps(mlp_body(1)).encode(), {})
    assert fast.status_code == 500 and fast.get_json() == {"error": "internal server error"}
    assert_same(fast, flask)
    assert [r.name for r in caplog.records if r.exc_info] == ["controlplane.fastpath", "controlplane.errors"]


def test_a_client_with_a_cookie_is_left_to_flask(client, flask_requests: list[str]) -> None:
    client.set_cookie("unrelated", "1")
    assert client.post(f"{MLP}/infer", json=mlp_body(1)).status_code == 200
    assert flask_requests == [f"{MLP}/infer"]


@pytest.fixture
def inference_needs_a_token(app_config: dict) -> None:
    app_config["inference_auth"] = True


@pytest.mark.usefixtures("inference_needs_a_token")
def test_with_inference_auth_flask_checks_the_token(app: Flask, client, flask_requests: list[str]) -> None:
    refused = client.post(f"{MLP}/infer", json=mlp_body(1))
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
    granted = client.post(f"{MLP}/infer", json=mlp_body(1), headers=token_for(app, "vic", Role.VIEWER))
    assert granted.status_code == 200
    outputs = granted.get_json()["outputs"]
    assert np.asarray(outputs[0]["data"]).size == outputs[0]["shape"][0] * outputs[0]["shape"][1]
    assert flask_requests == [f"{MLP}/infer", f"{MLP}/infer"]
