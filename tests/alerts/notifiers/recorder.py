"""A real HTTP server on 127.0.0.1 that records what notifiers send and answers as told."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer

from alerts.notifiers.delivery import deliver
from alerts.notifiers.targets import TargetPolicy

# The product refuses loopback destinations; these servers listen there, so tests allow it explicitly.
LOOPBACK = TargetPolicy.parse("127.0.0.1")
deliver_local = functools.partial(deliver, targets=LOOPBACK)


@dataclass(frozen=True)
class Recorded:
    """One request as it arrived on the wire."""

    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names lower-cased
    body: bytes


Answer = tuple[int, Mapping[str, str], bytes]


class RecordingServer:
    """Use as `with RecordingServer(200, b"ok") as server:`; the server stops when the block ends.

    `answer` may instead be a function of the recorded request (to echo it back, for instance);
    when it returns None the connection is closed unanswered, as when an answer is lost.
    """

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        answer: Callable[[Recorded], Answer | None] | None = None,
    ) -> None:
        self.answer = answer or (lambda _request: (status, headers or {}, body))
        self.requests: list[Recorded] = []

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> RecordingServer:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", "0"))
                request = Recorded(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length),
                )
                recorder.requests.append(request)
                answer = recorder.answer(request)
                if answer is None:
                    self.close_connection = True
                    return
                status, headers, body = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if status not in (204, 304):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body and status not in (204, 304):
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep test output quiet
                pass

        self._httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
