"""A small stand-in HTTP server for the endpoints runbooks need that the real server does not offer yet.

It answers the proposed engine desired-state API (PUT /api/engine/batching, POST /api/engine/compact,
GET /api/engine/desired) and the proposed slot reload, with every serving process applying a change
at once, and records every request it gets. Bound to 127.0.0.1 on a free port; the test that starts
it stops it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

Answer = tuple[int, Any]  # status, JSON payload (or a str sent as text)
Route = Callable[[Any], Answer]


@dataclass
class Seen:
    method: str
    path: str  # with its query string
    body: Any
    authorization: str | None


@dataclass
class FakeApi:
    """Routes (METHOD, path without query) -> a function of the JSON body returning (status, payload)."""

    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def start(self) -> FakeApi:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                fake.seen.append(Seen(self.command, self.path, body, self.headers.get("Authorization")))
                route = fake.routes.get((self.command, urlsplit(self.path).path))
                status, payload = (
                    route(body) if route else (404, {"error": {"code": "not_found", "message": "no route"}})
                )
                text = payload if isinstance(payload, str) else json.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(text.encode())))
                self.end_headers()
                self.wfile.write(text.encode())

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def openapi(*operations: tuple[str, str]) -> Route:
    """Answer /api/openapi.json listing these (METHOD, path) operations."""
    paths: dict[str, dict[str, Any]] = {}
    for method, path in operations:
        paths.setdefault(path, {})[method.lower()] = {"summary": "test"}
    return lambda _body: (200, {"openapi": "3.0.3", "paths": paths})


def engine_desired_state(processes: int = 2, max_queue_size: int = 128) -> dict[tuple[str, str], Route]:
    """The proposed engine desired-state endpoints, every process applying each change at once."""
    state = {"generation": 1, "compact_generation": 0}
    batching = {"max_batch_size": 32, "max_queue_delay_ms": 2.0, "max_queue_size": max_queue_size}

    def desired(_body: Any) -> Answer:
        rows = [
            {"process": f"host:{100 + i}", "generation": state["generation"],
             "compact_generation": state["compact_generation"], "error": "", "report": {"freed_bytes": 4096}}
            for i in range(processes)
        ]  # fmt: skip
        return 200, {**state, "batching": batching, "processes": rows}

    def put_batching(body: Any) -> Answer:
        batching.update(body)
        state["generation"] += 1
        return 200, {"generation": state["generation"], "batching": batching}

    def compact(_body: Any) -> Answer:
        state["compact_generation"] += 1
        return 202, {"compact_generation": state["compact_generation"]}

    return {
        ("GET", "/api/openapi.json"): openapi(
            ("PUT", "/api/engine/batching"), ("POST", "/api/engine/compact"), ("GET", "/api/engine/desired")
        ),
        ("GET", "/api/engine/desired"): desired,
        ("PUT", "/api/engine/batching"): put_batching,
        ("POST", "/api/engine/compact"): compact,
    }
