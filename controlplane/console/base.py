"""The console's blueprint and what every page shares: login required, the roles on the page, the headers.

Pages are rendered on the server from the same functions the JSON API answers with. Actions are
forms that console.js sends to that API (JSON, with the session's CSRF token in X-CSRF-Token), so
the console has no write path of its own: the API's role checks, validation and audit events apply.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import plotly
from flask import Blueprint, Response, g, make_response, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException

from controlplane.auth.guard import csrf_token, current_actor
from controlplane.auth.roles import Actor, Role
from controlplane.errors import ApiError

bp = Blueprint("console", __name__)
log = logging.getLogger(__name__)

View = TypeVar("View", bound=Callable[..., Any])

# Everything comes from this server: no CDN, no fonts, no inline script. plotly.js writes inline styles.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'self'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NAV = (
    ("console.overview", "Overview"),
    ("console.models", "Models"),
    ("dashboards.page", "Dashboards"),
    ("console.alerts", "Alerts"),
    ("console.runbooks", "Runbooks"),
    ("console.audit", "Audit log"),
    ("console.settings", "Settings"),
    ("docs.docs_page", "Docs"),  # the bundled documentation site (docs_view), offline
)


def actor() -> Actor:
    """Return the logged-in actor of this page (login_required put it there)."""
    return g.console_actor


def can(role: Role | str) -> bool:
    """Return whether the page's actor has `role` or higher."""
    who = g.get("console_actor")
    return who is not None and who.role >= Role(role)


def safe_next(target: str | None) -> str:
    """Return `target` if it is a path on this site, else the overview (no open redirects)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return url_for("console.overview")
    if not target.isprintable():  # CR/LF would split the Location header (a 500 before)
        return url_for("console.overview")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return url_for("console.overview")
    return target


def login_required(view: View) -> View:
    """Send a visitor without a session (or token) to the login page, then back here."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        who = current_actor()
        if who is None:
            here = request.full_path if request.query_string else request.path
            return redirect(url_for("console.login", next=here))
        g.console_actor = who
        return view(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


def page(template: str, status: int = 200, **context: Any) -> Response:
    """Render a console page with the console's security headers."""
    response = make_response(render_template(template, **context), status)
    response.headers.update(PAGE_HEADERS)
    return response


@bp.app_context_processor
def _console_context() -> dict[str, Any]:
    return {
        "nav": NAV,
        "can": can,
        "console_actor": g.get("console_actor"),
        "csrf_token": csrf_token,
        "plotly_version": plotly.__version__,
    }


@bp.app_template_filter("when")
def _when(value: str | None) -> str:
    """Show an ISO time as 'YYYY-MM-DD HH:MM:SS' (UTC), or a dash."""
    if not value:
        return "–"
    return value.replace("T", " ")[:19]


@bp.errorhandler(ApiError)
def _page_error(exc: ApiError) -> Response:
    """Show a refused or missing page as a page, not as the API's JSON."""
    if exc.status >= 500:
        log.error("console page %s failed: %s", request.path, exc.message)
    return page("console/message.html", exc.status, title=exc.code.replace("_", " ").capitalize(), message=exc.message)


@bp.errorhandler(Exception)
def _page_failure(exc: Exception) -> Response:
    """Show a page that broke as a page with its request id (logged once, here), never a stack trace."""
    if isinstance(exc, HTTPException):
        return exc  # type: ignore[return-value]  # werkzeug's own answer (405, ...)
    log.exception("console page %s failed", request.path)
    message = f"Something went wrong on our side; the log has the details under request id {g.get('request_id', '?')}."
    return page("console/message.html", 500, title="Server error", message=message)
