"""The management API's error envelope, and the app-wide handlers.

Everything under /v2 answers in the inference protocol's {"error": "..."} form; everything else
in one envelope: {"error": {"code": ..., "message": ..., "request_id": ...}}.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, g, json, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A management API failure with its HTTP status and a stable code."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported_media_type"


def error_response(status: int, code: str, message: str) -> Response:
    """Build the error response in the form the request's path calls for."""
    if request.path.startswith("/v2"):
        payload: dict = {"error": message}
    else:
        payload = {"error": {"code": code, "message": message, "request_id": g.get("request_id")}}
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def register_handlers(app: Flask) -> None:
    """Install one set of handlers: API errors, HTTP errors, and anything unexpected."""

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError) -> Response:
        return error_response(exc.status, exc.code, exc.message)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        code = (exc.name or "error").lower().replace(" ", "_")
        return error_response(exc.code or 500, code, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal", "internal server error")
