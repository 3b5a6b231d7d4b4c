"""What a request handler reaches through Flask's context: the services, the database session, the request's id.

`create_app` puts the `Services` the composition root built under `app.extensions[KEY]`; nothing
else reads that key. Kept apart from `services.py` so views and guards import it without pulling
in the engine, the scheduler and the alert evaluator. `init_app` installs the hooks that open a
request's scope (`requestscope`, read by the audit trail and the logs) and close its session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask, current_app, g, request
from sqlalchemy.orm import Session

from controlplane.requestid import request_id_from
from controlplane.requestscope import RequestScope, enter_request, leave_request

if TYPE_CHECKING:
    from controlplane.services import Services

KEY = "flightdeck"


def current_services() -> Services:
    """Return the services of the application handling the current request."""
    return current_app.extensions[KEY]


def app_services(app: Flask) -> Services:
    """Return the services of `app` (for blueprint setup, outside a request)."""
    return app.extensions[KEY]


def get_db() -> Session:
    """Return this request's session, opening it on first use."""
    if "db" not in g:
        g.db = current_services().sessions()
    return g.db


def close_db(_exc: BaseException | None = None) -> None:
    """Close this request's session, if one was opened."""
    db = g.pop("db", None)
    if db is not None:
        db.close()


def begin_request() -> None:
    """Give the request its id (the caller's X-Request-ID when sensible) and enter its scope."""
    g.request_id = request_id_from(request.headers.get("X-Request-ID"))
    enter_request(RequestScope(g.request_id, request.remote_addr))


def end_request(_exc: BaseException | None = None) -> None:
    """Leave the request's scope."""
    leave_request()


def init_app(app: Flask) -> None:
    """Install the request hooks; call before registering blueprints, so every other hook runs inside the scope."""
    app.before_request(begin_request)
    app.teardown_request(end_request)
    app.teardown_appcontext(close_db)
