"""Delivery over real sockets: network errors, timeouts, redirects, and no secret in what is logged."""

from __future__ import annotations

import logging
import socket
from datetime import datetime

import pytest

from alerts.notifiers import Notification, Notifier, Outgoing, deliver, make_notifier
from alerts.notifiers.delivery import send
from tests.alerts.notifiers.recorder import LOOPBACK, Recorded, RecordingServer
from tests.alerts.notifiers.samples import NOW

TOKEN = "T0ken5ecret987654321"


def test_connection_refused_is_retryable_and_names_no_secret(
    firing: Notification, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    notifier = make_notifier("slack", {"url": f"http://127.0.0.1:{port}/services/{TOKEN}", "allow_http": True})
    with caplog.at_level(logging.INFO, logger="alerts.notifiers.delivery"):
        result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert (result.ok, result.permanent) == (False, False)
    assert result.error.startswith("network error:")
    assert TOKEN not in result.error and TOKEN not in caplog.text
    assert f"url=http://127.0.0.1:{port}/***" in caplog.text and "outcome=retry" in caplog.text


def test_a_silent_server_times_out_as_retryable(firing: Notification) -> None:
    with socket.socket() as listener:  # accepts connections into its backlog, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook/{TOKEN}"
        result = deliver(
            make_notifier("discord", {"url": url, "allow_http": True}), firing, NOW, timeout_s=0.2, targets=LOOPBACK
        )
    assert (result.ok, result.permanent) == (False, False)
    assert "timed out" in result.error and TOKEN not in result.error


def test_redirects_are_not_followed(firing: Notification) -> None:
    with RecordingServer(302, b"", {"Location": "/elsewhere"}) as server:
        notifier = make_notifier("slack", {"url": f"{server.url}/services/{TOKEN}", "allow_http": True})
        result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert len(server.requests) == 1
    assert (result.ok, result.permanent) == (False, True)


def test_an_answer_body_is_never_echoed_in_the_error(firing: Notification, caplog: pytest.LogCaptureFixture) -> None:
    def echo(request: Recorded) -> tuple[int, dict[str, str], bytes]:
        return 400, {}, f"no such hook: http://127.0.0.1{request.path} ({TOKEN})".encode()

    with RecordingServer(answer=echo) as server:
        notifier = make_notifier("wecom", {"url": f"{server.url}/send?key={TOKEN}", "allow_http": True})
        with caplog.at_level(logging.INFO, logger="alerts.notifiers.delivery"):
            result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert result.permanent and result.error == "HTTP 400"  # the status only: the body is the destination's
    assert TOKEN not in caplog.text and "no such hook" not in caplog.text


def test_send_returns_status_headers_and_body_for_any_status() -> None:
    with RecordingServer(503, b"down", {"Retry-After": "9"}) as server:
        status, headers, body = send(
            Outgoing("POST", server.url + "/x", {"Content-Type": "text/plain"}, b"hi"), 5, LOOPBACK
        )
    assert (status, headers["Retry-After"], body) == (503, "9", b"down")
    assert server.requests[0].body == b"hi"


class Broken(Notifier):
    kind = "broken"

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        raise ValueError(f"cannot render for {self.url}")


def test_a_message_that_cannot_be_built_is_a_permanent_failure(firing: Notification) -> None:
    result = deliver(Broken({"url": f"https://h.example/{TOKEN}"}), firing, NOW)
    assert (result.ok, result.permanent) == (False, True)
    assert result.error == "cannot build the message: cannot render for ***"


def test_a_lost_answer_may_have_delivered_a_refused_connection_did_not(firing: Notification) -> None:
    with RecordingServer(answer=lambda _request: None) as server:  # reads the request, closes unanswered
        notifier = make_notifier("slack", {"url": f"{server.url}/services/{TOKEN}", "allow_http": True})
        lost = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert (lost.ok, lost.permanent, lost.maybe_delivered) == (False, False, True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = make_notifier("slack", {"url": f"http://127.0.0.1:{port}/services/{TOKEN}", "allow_http": True})
    refused = deliver(closed, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert (refused.ok, refused.maybe_delivered) == (False, False)
