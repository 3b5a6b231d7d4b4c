"""The request being handled, for code below the web layer: its id and the client's address.

The web layer enters a scope when a request begins and leaves it when the request ends (the app
factory's hooks); the audit trail and the log filter read it without importing Flask. A context
variable, so each of the thread pool's requests sees its own.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestScope:
    request_id: str
    address: str | None  # the connection's peer only: no forwarding header is trusted here


_current: ContextVar[RequestScope | None] = ContextVar("flightdeck_request", default=None)


def current_request() -> RequestScope | None:
    """Return the scope of the request this thread is handling, or None outside a request."""
    return _current.get()


def enter_request(scope: RequestScope) -> None:
    """Mark `scope` as the request this thread is handling."""
    _current.set(scope)


def leave_request() -> None:
    """Mark this thread as handling no request (a pooled thread must not carry the last one's)."""
    _current.set(None)
