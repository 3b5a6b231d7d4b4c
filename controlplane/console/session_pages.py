"""Logging in and out of the console: plain HTML forms with a CSRF token, throttled like the API."""

from __future__ import annotations

import secrets

from flask import Response, redirect, request, session, url_for

from controlplane.auth.audit import record_event
from controlplane.auth.errors import AuthError
from controlplane.auth.guard import csrf_matches, current_actor, end_session, public
from controlplane.auth.login import log_in
from controlplane.auth.throttle import current_throttle
from controlplane.console.base import bp, page, safe_next
from controlplane.context import get_db

FORM_FIELD = "csrf_token"


def _form_csrf_ok() -> bool:
    return csrf_matches(request.form.get(FORM_FIELD, ""))


def _login_page(
    error: str | None = None, status: int = 200, name: str = "", headers: dict[str, str] | None = None
) -> Response:
    # NOTE: a visitor gets a CSRF token before logging in, so nobody can log a browser in as someone else.
    if not isinstance(session.get("csrf"), str):
        session["csrf"] = secrets.token_urlsafe(32)
    response = page("console/login.html", status, error=error, name=name, next=safe_next(request.values.get("next")))
    response.headers.update(headers or {})
    return response


@bp.get("/login")
@public
def login() -> Response:
    """Show the login form (or go on, when already logged in)."""
    if current_actor() is not None:
        return redirect(safe_next(request.args.get("next")))
    return _login_page()


@bp.post("/login")
@public
def login_submit() -> Response:
    """Check the form's name and password; on success start a session and go where the user was headed."""
    name, password = request.form.get("name", ""), request.form.get("password", "")
    if not _form_csrf_ok():
        return _login_page("The form expired; please log in again.", 400, name)
    if not name or not password:
        return _login_page("Enter your name and password.", 400, name)
    try:
        log_in(get_db(), current_throttle(), name, password, request.remote_addr)
    except AuthError as exc:
        message = "Wrong name or password." if exc.status == 401 else f"Refused: {exc.message}."
        return _login_page(message, exc.status, name, exc.headers)
    return redirect(safe_next(request.form.get("next")))


@bp.post("/logout")
@public
def logout() -> Response:
    """End the session (the form carries the CSRF token) and show the login page."""
    who = current_actor()
    if who is not None and who.kind == "user":
        if not _form_csrf_ok():
            return page(
                "console/message.html",
                400,
                title="Not logged out",
                message="The form expired; reload the page and try again.",
            )
        db = get_db()
        record_event(db, who, "auth.logout", who.name, "ok")
        db.commit()
    end_session()
    return redirect(url_for("console.login"))
