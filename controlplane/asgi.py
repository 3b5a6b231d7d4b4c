"""The server's front: inference requests answered on the event loop, everything else by Flask.

gunicorn runs this ASGI app in `controlplane.worker.FlightdeckWorker` (uvicorn's HTTP parser in C,
on uvloop). `POST /v2/models/<name>[/versions/<version>]/infer` is read, decoded, queued in the
engine's batcher, awaited and written here, on the loop: no thread per request and no hand-off
but the batcher's own (the batcher wakes the loop once per answered request; see `inference.run_on_loop`). The
same `inference.Call` as the Flask view does the decoding, answering, counting and logging, so
the two answer alike. Every other request goes to the Flask app through a2wsgi's thread pool
(`FLIGHTDECK_THREADS` threads), and so do inference requests it cannot answer exactly as Flask
would: FLIGHTDECK_INFERENCE_AUTH on (token checks need a database session), a session cookie
(Flask would open that session), a mount point (root_path) or a path that is not ASCII.

The probes (`GET /v2/health/live`, `/v2/health/ready`) are answered here too, so a Flask thread pool
held busy (slow clients, long API calls) never makes a healthy pod fail its liveness probe. A body
over FLIGHTDECK_DECODE_THREAD_BYTES is decoded in a thread of its own pool, not on the loop. A body
that stops arriving is ended by the connection's body deadline (`controlplane.httpprotocol`): the
request is logged as 408.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from a2wsgi import WSGIMiddleware
from flask import Flask

from controlplane import context
from controlplane.httpprotocol import INFER_PATH, TIMED_OUT
from controlplane.inference import Answer, Call, run_on_loop, too_many_values
from controlplane.requestid import request_id_from
from serving.codec import HEADER_LENGTH
from serving.errors import PayloadTooLarge, ServingError

if TYPE_CHECKING:
    from controlplane.services import Services

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# Flask's rules for the view, `<name>` and `<version>` being Werkzeug's default converter ([^/]+).
_INTERNAL_ERROR = json.dumps({"error": "internal server error"}).encode()
_PROBES = {"/v2/health/live", "/v2/health/ready"}
DECODE_THREADS = 2  # NOTE: big bodies decode two at a time; more would only share the same cores and the GIL


class ClientGone(Exception):
    """The client closed the connection before its request body arrived: nothing to answer."""


class Front:
    """ASGI app: inference on the event loop, the rest to Flask (see the module's docstring)."""

    def __init__(self, flask_app: Flask) -> None:
        self.flask_app = flask_app
        self.services: Services = context.app_services(flask_app)
        threads = self.services.settings.http_threads
        self.flask = WSGIMiddleware(_input_terminated(flask_app.wsgi_app), workers=threads)
        self._decoder = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="decode")
        self._node = self.services.settings.node_name.encode("latin-1", "replace")  # X-Flightdeck-Node

    def begin_drain(self) -> None:
        """Stop admitting inference requests at once (readiness turns false); accepted ones finish."""
        self.services.engine.begin_drain()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] in _PROBES
            and scope["method"] == "GET"
            and not scope.get("root_path")
        ):
            await self._probe(scope, send)
            return
        name_version = self._inference_route(scope)
        if name_version is None:
            await self.flask(scope, receive, send)
            return
        headers = dict(scope["headers"])  # NOTE: names arrive lower-case; a repeated header keeps its last value
        if b"cookie" in headers:
            await self.flask(scope, receive, send)
            return
        try:
            await self._infer(scope, headers, receive, send, *name_version)
        except ClientGone:
            return

    async def _probe(self, scope: Scope, send: Send) -> None:
        """Answer a liveness or readiness probe on the loop, as the Flask views `oip.live` and `oip.ready` do."""
        request_id = request_id_from(dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1") or None)
        if scope["path"].endswith("/live"):
            status, body = 200, b'{"live": true}'
        else:
            ready = self.services.engine.ready()
            status, body = (200, b'{"ready": true}') if ready else (503, b'{"ready": false}')
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": _headers(Answer(status, body), request_id, self._node),
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _inference_route(self, scope: Scope) -> tuple[str, str | None] | None:
        """Return (model, version) when this request may be answered here, else None."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path = scope["path"]
        if not path.isascii():
            return None
        match = INFER_PATH.fullmatch(path)
        if match is None or self.services.settings.inference_auth:
            return None
        return match[1], match[2]

    async def _infer(
        self, scope: Scope, headers: dict[bytes, bytes], receive: Receive, send: Send, name: str, version: str | None
    ) -> None:
        def header(name: str) -> str | None:
            value = headers.get(name.lower().encode("latin-1"))
            return None if value is None else value.decode("latin-1")

        services = self.services
        request_id = request_id_from(header("X-Request-ID"))
        try:
            call = Call(services.engine, services.settings, name, version, request_id, header, services.tracing)
            try:
                call.admit()
                # NOTE: a body all JSON is counted as it arrives, so millions of values are refused unread.
                values = None if header(HEADER_LENGTH) is not None else services.settings.max_request_values
                body = await read_body(receive, header("Content-Length"), services.settings.max_request_bytes, values)
                if len(body) > services.settings.decode_thread_bytes:
                    routing = await asyncio.get_running_loop().run_in_executor(self._decoder, call.decode, body)
                else:
                    routing = call.decode(body)
                answer = call.succeeded(await run_on_loop(services.engine, name, routing))
            except ServingError as exc:
                answer = call.refused(exc)
                if isinstance(exc, PayloadTooLarge):  # NOTE: the rest of its body is not read: the connection ends
                    answer.headers.append(("Connection", "close"))
            except ClientGone:
                if scope.get("extensions", {}).get(TIMED_OUT):
                    call.status = 408  # the connection's body deadline (controlplane.httpprotocol) answered it
                    call.record["error"] = "the request body stopped arriving"
                else:
                    call.status = 499  # nginx's "client closed request": in the log, not a server error
                    call.record["error"] = "the client closed the connection before its body arrived"
                raise
            finally:
                call.log()
        except ClientGone:
            raise
        except Exception:  # as the app's handler for unexpected errors: logged once, a bare 500
            log.exception("unhandled error on POST %s", f"/v2/models/{name}/infer")
            answer = Answer(500, _INTERNAL_ERROR)
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": _headers(answer, request_id, self._node),
            }
        )
        await send({"type": "http.response.body", "body": answer.body})


async def read_body(receive: Receive, length: str | None, limit: int, max_values: int | None = None) -> bytes:
    """Read the whole request body, refusing one over `limit` bytes (413) before reading it when it says so.

    With `max_values`, a JSON body whose commas reach it (an upper bound on its values) is refused (413)
    without being kept: the rest (within `limit`) is read and dropped before the answer, because closing a
    connection with unread bytes makes the kernel reset it, and a client still sending then gets
    "connection reset" instead of the 413 (nginx's lingering close, for the same reason).
    """
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLarge(f"request body of {int(length)} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    values_limit = max_values or 0
    refused = False  # too many values: from then on the rest is only counted against `limit`, not kept
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        if not refused:
            chunks.append(chunk)
            if max_values is not None:
                max_values -= chunk.count(b",")
                refused = max_values <= 0
                if refused:
                    chunks.clear()
        if not message.get("more_body", False):
            if refused:
                raise too_many_values(values_limit)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _headers(answer: Answer, request_id: str, node: bytes) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"Content-Type", answer.content_type.encode("latin-1")),
        (b"Content-Length", str(len(answer.body)).encode("latin-1")),
    ]
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers)
    headers.append((b"X-Request-ID", request_id.encode("latin-1")))
    headers.append((b"X-Flightdeck-Node", node))  # which node answered, behind a load balancer
    return headers


def _input_terminated(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """Tell Werkzeug the input stream ends with the body (a2wsgi's does), so chunked uploads are read.

    NOTE: gunicorn says the same of its own streams; without it Flask reads a body sent without a
    Content-Length (chunked) as empty.
    """

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ["wsgi.input_terminated"] = True
        return app(environ, start_response)

    return wsgi
