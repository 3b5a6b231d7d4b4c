"""The management API's error tree: each class carries its HTTP status and a stable code.

Services raise these; the web layer (`errorhandlers.py`) turns them into the one error envelope.
"""

from __future__ import annotations


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
