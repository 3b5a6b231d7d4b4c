"""The session cookie: HttpOnly and SameSite=Lax always, Secure as FLIGHTDECK_COOKIE_SECURE says, and its lifetime.

'auto' sets Secure when the request arrived over HTTPS, so the embedded default (plain HTTP on
127.0.0.1) still logs in, while a console behind TLS never sends its cookie in the clear.
"""

from __future__ import annotations

from datetime import timedelta

from flask import Flask, Request, request
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface


class SessionCookies(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions with the Secure flag decided per request in 'auto' mode."""

    def __init__(self, secure: str) -> None:
        self.secure = secure

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        """Return an empty session at once when the request has no cookie (every API and inference client)."""
        # NOTE: Flask builds a signing serializer for every request before it looks at the cookie, and
        # request.cookies walks every header even when there is no Cookie header at all.
        if app.secret_key and (
            "HTTP_COOKIE" not in request.environ or self.get_cookie_name(app) not in request.cookies
        ):
            return self.session_class()
        return super().open_session(app, request)

    def get_cookie_secure(self, app: Flask) -> bool:
        """Return whether this response's session cookie carries the Secure flag."""
        if self.secure == "always":
            return True
        if self.secure == "never":
            return False
        return request.is_secure


def init_cookies(app: Flask, secure: str, lifetime: timedelta) -> None:
    """Install the session interface, the cookie flags and how long a login lasts on `app`."""
    app.session_interface = SessionCookies(secure)
    # NOTE: Flask refuses a signed cookie older than this, and the cookie is signed at login (nothing
    # rewrites the session after it), so this is the login's absolute lifetime.
    app.permanent_session_lifetime = lifetime
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    if app.config.get("SESSION_COOKIE_SAMESITE") is None:
        app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
