"""The gRPC calls that REST's Flask views already answer, answered by those very views, in-process.

Metadata, configuration, statistics, model readiness and the model repository are rare calls whose
REST views hold the rules: inference auth, the operator role, audit events (a refusal included), the
request id, the wording of every refusal. Rather than a second copy of those, each such gRPC call
becomes the REST request it stands for (`Authorization` and `X-Request-ID` from its metadata, the
peer's address as the client's), run through the Flask app's WSGI callable in a thread of its own
pool, and its JSON answer is what the gRPC answer is built from. The cost, about a millisecond of a
thread, is nothing for these calls; the hot ones (ModelInfer, ServerLive, ServerReady) never come here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from flask import Flask
from werkzeug.test import EnvironBuilder, run_wsgi_app

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ViewAnswer:
    """What the REST view answered: status, the JSON it sent, and its error message when it refused."""

    status: int
    body: Any

    @property
    def message(self) -> str:
        """The refusal's message, from the inference protocol's {"error": "..."} or the API's envelope."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(error, dict):
            error = error.get("message")
        return str(error) if error else f"HTTP {self.status}"


def model_path(name: str, version: str, suffix: str = "") -> str:
    """Return /v2/models/<name>[/versions/<version>]<suffix>, each name quoted as one path segment."""
    path = f"/v2/models/{quote(name, safe='')}"
    if version:
        path += f"/versions/{quote(version, safe='')}"
    return path + suffix


class ViewBridge:
    """Runs REST requests through the Flask app, off the event loop (see the module's docstring)."""

    def __init__(self, app: Flask, threads: int) -> None:
        self.app = app
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grpc-view")

    async def call(self, method: str, path: str, headers: dict[str, str], peer: str, body: Any = None) -> ViewAnswer:
        """Answer `method path` (with a JSON body when given) as the REST API would, from `peer`."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._call, method, path, headers, peer, body)

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """Run `function(*args)` in the pool (a database lookup, say), off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    def _call(self, method: str, path: str, headers: dict[str, str], peer: str, body: Any) -> ViewAnswer:
        data = None if body is None else json.dumps(body).encode()
        environ = EnvironBuilder(
            path=path,
            method=method,
            headers=headers,
            data=data,
            content_type=None if data is None else "application/json",
            environ_base={"REMOTE_ADDR": peer},
        ).get_environ()
        app_iter, status, _headers = run_wsgi_app(self.app.wsgi_app, environ, buffered=True)
        try:
            raw = b"".join(app_iter)
        finally:
            close = getattr(app_iter, "close", None)
            if close is not None:
                close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return ViewAnswer(int(status.split(" ", 1)[0]), parsed)

    def close(self) -> None:
        """Let the pool's threads end once their calls are done."""
        self._pool.shutdown(wait=False)
