"""The session cookie's flags: HttpOnly and SameSite=Lax always, Secure as FLIGHTDECK_COOKIE_SECURE says.

'auto' sets Secure when the request arrived over HTTPS, so the embedded default (plain HTTP on
127.0.0.1) still logs in, while a console behind TLS never sends its cookie in the clear.
"""

from __future__ import annotations

from flask import Flask, request
from flask.sessions import SecureCookieSessionInterface


class SessionCookies(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions with the Secure flag decided per request in 'auto' mode."""

    def __init__(self, secure: str) -> None:
        self.secure = secure

    def get_cookie_secure(self, app: Flask) -> bool:
        """Return whether this response's session cookie carries the Secure flag."""
        if self.secure == "always":
            return True
        if self.secure == "never":
            return False
        return request.is_secure


def init_cookies(app: Flask, secure: str) -> None:
    """Install the session interface and the cookie flags on `app`."""
    app.session_interface = SessionCookies(secure)
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    if app.config.get("SESSION_COOKIE_SAMESITE") is None:
        app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
