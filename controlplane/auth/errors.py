"""Authentication and authorisation failures, in the management API's envelope."""

from __future__ import annotations

from controlplane.errors import ApiError

REALM = 'Bearer realm="flightdeck"'


class AuthError(ApiError):
    """An access failure; `headers` go on the response (a challenge, a Retry-After)."""

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = dict(headers or {})


class Unauthorized(AuthError):
    """No credentials, or credentials that prove nothing (401, with a WWW-Authenticate challenge)."""

    status = 401
    code = "unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        challenge = f'{REALM}, error="invalid_token"' if invalid_token else REALM
        super().__init__(message, {"WWW-Authenticate": challenge})


class Forbidden(AuthError):
    """Known caller, not allowed: a role too low, someone else's token, or a missing CSRF token (403)."""

    status = 403
    code = "forbidden"


class TooManyAttempts(AuthError):
    """Login refused without checking the password because of recent failures (429)."""

    status = 429
    code = "too_many_requests"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})
