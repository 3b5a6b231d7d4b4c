"""The inference fast path: `POST /v2/models/<name>[/versions/<version>]/infer` served below Flask.

Flask's per-request machinery (request context, URL matching among every rule, the auth guard,
the request-id hooks, the database teardown) cost more than the engine itself on a batch-1
request. `FastInfer` wraps the app's WSGI callable and answers exactly those two routes through
`inference.serve`, the same function the Flask view calls, with the same headers, error bodies,
metrics and request log. Whatever it cannot answer exactly as Flask would, it hands to Flask:
other paths and methods, FLIGHTDECK_INFERENCE_AUTH on (token checks need a database session),
a session cookie (Flask would open that session), a SCRIPT_NAME or a path that is not ASCII.

`create_app` installs it (`app.wsgi_app = FastInfer(app.wsgi_app, services)`), so gunicorn, the
tests' servers and Flask's test client all go through it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from controlplane.inference import Answer, read_body, serve
from controlplane.requestid import request_id_from

if TYPE_CHECKING:
    from controlplane.services import Services

log = logging.getLogger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# Flask's rules for the view, `<name>` and `<version>` being Werkzeug's default converter ([^/]+).
_INFER = re.compile(r"/v2/models/([^/]+)/(?:versions/([^/]+)/)?infer")
_INTERNAL_ERROR = json.dumps({"error": "internal server error"}).encode()


def _status_line(code: int) -> str:
    # NOTE: Werkzeug's own status line (upper-case reason), so both paths answer alike byte for byte.
    return f"{code} {HTTP_STATUS_CODES.get(code, 'UNKNOWN').upper()}"


_STATUS_LINES: dict[int, str] = {code: _status_line(code) for code in HTTP_STATUS_CODES}


class FastInfer:
    """WSGI middleware: serve inference requests without Flask, hand everything else to `app`."""

    def __init__(self, app: WSGIApp, services: Services) -> None:
        self.app = app  # the Flask app's own wsgi_app: every declined request goes there
        self.services = services

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Answer an inference request here, or pass the request to Flask untouched."""
        match = self._match(environ)
        if match is None:
            return self.app(environ, start_response)
        name, version = match.groups()
        request_id = request_id_from(environ.get("HTTP_X_REQUEST_ID"))
        try:
            answer = serve(
                self.services.engine,
                self.services.settings,
                name,
                version,
                request_id,
                lambda header: environ.get("HTTP_" + header.upper().replace("-", "_")),
                lambda limit: read_body(environ, limit),
            )
        except HTTPException as exc:  # Werkzeug's refusals while reading the body: as the app's handler answers them
            answer = Answer(exc.code or 500, json.dumps({"error": exc.description or exc.name}).encode())
        except Exception:  # as the app's handler for unexpected errors: logged once, a bare 500
            log.exception("unhandled error on %s %s", environ["REQUEST_METHOD"], environ["PATH_INFO"])
            answer = Answer(500, _INTERNAL_ERROR)
        headers = [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))]
        headers.extend(answer.headers)
        headers.append(("X-Request-ID", request_id))
        start_response(_STATUS_LINES.get(answer.status) or _status_line(answer.status), headers)
        return [answer.body]

    def _match(self, environ: dict[str, Any]) -> re.Match[str] | None:
        """Return the inference route's match when this request may take the fast path, else None."""
        if environ.get("REQUEST_METHOD") != "POST":
            return None
        path = environ.get("PATH_INFO", "")
        # NOTE: Flask decodes a non-ASCII PATH_INFO (latin-1 bytes as UTF-8); leave that, and mounts, to it.
        if not path.isascii() or environ.get("SCRIPT_NAME") or "HTTP_COOKIE" in environ:
            return None
        match = _INFER.fullmatch(path)
        if match is None or self.services.settings.inference_auth:
            return None
        return match
