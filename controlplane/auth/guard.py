"""Who is asking, and may they: bearer tokens, the session cookie, CSRF, `require_role`, app-wide checks.

A request is authenticated by `Authorization: Bearer <token>` when that header is present (a bad
token is a 401, never a fall-back to the cookie), else by the signed session cookie that
`POST /api/session` sets. Cookie-authenticated POST/PUT/PATCH/DELETE requests must also send the
session's CSRF token in `X-CSRF-Token`; bearer requests need none (a browser never adds them).
"""

from __future__ import annotations

import functools
import hmac
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Response, current_app, g, request, session
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from controlplane.auth import login_sessions, tokens
from controlplane.auth.audit import record_event, refusals_recorded
from controlplane.auth.errors import AuthError, Forbidden, Unauthorized
from controlplane.auth.roles import Actor, Role
from controlplane.context import current_services, get_db
from controlplane.errorhandlers import error_response
from controlplane.models import User

log = logging.getLogger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READING = frozenset({"GET", "HEAD"})
CSRF_HEADER = "X-CSRF-Token"
ACCESS = "flightdeck_access"  # attribute on a view: the Role it requires, or PUBLIC
PUBLIC = "public"
OPEN_READS = frozenset({"/api/openapi.json"})  # readable even with FLIGHTDECK_AUTH_READS on
_UNSET = object()

View = TypeVar("View", bound=Callable[..., Any])


def _in_own_transaction(change: Callable[[Session], object], what: str) -> None:
    # NOTE: a separate short transaction, so the request's own session commits nothing it did not ask for.
    try:
        with current_services().sessions() as db:
            change(db)
            db.commit()
    except SQLAlchemyError:
        log.warning("could not record %s", what, exc_info=True)


def _touch(token_id: int, now: datetime) -> None:
    _in_own_transaction(lambda db: tokens.touch(db, token_id, now), f"the use of token {token_id}")


def _actor_from_token(secret: str) -> Actor | None:
    now = datetime.now(UTC)
    found = tokens.find_token(get_db(), secret, now)
    if found is None:
        return None
    token, user = found
    if token.last_used_at is None or token.last_used_at < now - tokens.TOUCH_EVERY:
        _touch(token.id, now)
    return Actor(
        name=user.name, role=tokens.effective_role(token, user), kind="token", token_id=token.id, user_id=user.id
    )


def _actor_from_cookie() -> Actor | None:
    session_id = session.get("sid")
    if not isinstance(session_id, str):
        return None
    # The cookie's random id must name a live session row: logout, a password or role change and
    # disabling the user delete it, and nothing in the cookie is derived from the password hash.
    found = login_sessions.find_login(get_db(), session_id)
    if found is None:
        return None
    login, user = found
    now = datetime.now(UTC)
    idle = timedelta(minutes=current_services().settings.session_idle_minutes)
    if not login_sessions.is_live(login, user, now, idle):  # past its absolute or idle timeout: gone for good
        _in_own_transaction(lambda db: login_sessions.end_session(db, session_id), "the end of a timed-out session")
        return None
    if login_sessions.touch_due(login, now):
        _in_own_transaction(lambda db: login_sessions.touch(db, login.id, now), "the use of a login session")
    return Actor(name=user.name, role=Role(user.role), kind="user", user_id=user.id)


def _authenticate() -> Actor | None:
    header = request.headers.get("Authorization")
    if header is None:
        return _actor_from_cookie()
    scheme, _, secret = header.partition(" ")
    actor = _actor_from_token(secret.strip()) if scheme.lower() == "bearer" and secret.strip() else None
    g.bad_credentials = actor is None
    return actor


def current_actor() -> Actor | None:
    """Return who this request acts as (bearer token first, else the session cookie), or None."""
    actor = g.get("actor", _UNSET)
    if actor is _UNSET:
        actor = g.actor = _authenticate()
    return actor


def request_audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
    """Record an audit event as whoever this request acts as: the `Audit` views hand to services."""
    record_event(session, current_actor(), action, target, outcome, detail)


def refusals_audited(action: str, target: Callable[..., str]) -> Callable[[View], View]:
    """Record any refusal of the view, its body's parsing included, as a 'denied' or 'error' event (above `operation`).

    `target(**view_kwargs)` names what the request aimed at. For views whose services do not
    record their own refusals; one that does (`audited`) would record it twice.
    """

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            with refusals_recorded(get_db(), current_actor(), action, target(**kwargs)):
                return view(*args, **kwargs)

        return recorded  # type: ignore[return-value]

    return decorate


def bearer_actor() -> Actor | None:
    """Return the actor of this request's bearer token, or None (a session cookie does not count)."""
    actor = current_actor()
    return actor if actor is not None and actor.kind == "token" else None


def start_session(user: User) -> str:
    """Log `user` in on this response's session cookie; return the new CSRF token."""
    session.clear()  # NOTE: a fresh session at login, so nothing set before it (fixation) survives
    lifetime = current_app.permanent_session_lifetime
    session["sid"] = login_sessions.open_session(
        get_db(), user, datetime.now(UTC), lifetime, request.remote_addr, request.user_agent.string
    )  # the caller commits
    session["csrf"] = secrets.token_urlsafe(32)
    g.actor = Actor(name=user.name, role=Role(user.role), kind="user", user_id=user.id)
    return session["csrf"]


def end_session() -> None:
    """End the session cookie's login: its row goes (in a short transaction of its own) and the cookie is cleared."""
    session_id = session.get("sid")
    if isinstance(session_id, str):
        with current_services().sessions() as db:
            login_sessions.end_session(db, session_id)
            db.commit()
    session.clear()
    g.actor = None


def csrf_token() -> str | None:
    """Return the CSRF token of this request's session, if it has one."""
    token = session.get("csrf")
    return token if isinstance(token, str) else None


def csrf_matches(given: str) -> bool:
    """Return whether `given` is this request's session CSRF token (a form field, say)."""
    expected = csrf_token()
    return bool(expected and given) and hmac.compare_digest(expected.encode(), given.encode())


def csrf_ok() -> bool:
    """Return whether the request's X-CSRF-Token header matches its session's token."""
    return csrf_matches(request.headers.get(CSRF_HEADER, ""))


def check_access(role: Role) -> Actor:
    """Return the request's actor if it has `role` or higher; raise Unauthorized or Forbidden otherwise."""
    actor = current_actor()
    if actor is None:
        if g.get("bad_credentials"):
            raise Unauthorized("the bearer token is malformed, unknown, expired or revoked", invalid_token=True)
        raise Unauthorized(
            "authentication required: send 'Authorization: Bearer <token>', or log in (the console's /login, or POST /api/session)"
        )
    if request.method in MUTATING and actor.kind == "user" and not csrf_ok():
        raise Forbidden(
            f"a request authenticated by the session cookie must send the {CSRF_HEADER} header "
            "(its value comes from POST or GET /api/session)"
        )
    if actor.role < role:
        raise Forbidden(f"this needs the {role} role or higher; {actor.name} has {actor.role}")
    return actor


def refusal(exc: AuthError, needed: Role | None = None, action: str | None = None) -> Response:
    """Answer a refused request in the management envelope; a refused mutation leaves a 'denied' audit event."""
    if request.method in MUTATING:
        detail: dict[str, Any] = {"method": request.method, "error": exc.message}
        if needed is not None:
            detail["needed"] = needed.value
        db = get_db()
        try:
            record_event(db, current_actor(), action or f"http.{request.endpoint}", request.path, "denied", detail)
            db.commit()
        except SQLAlchemyError:
            db.rollback()
            log.exception("could not record a denied %s %s", request.method, request.path)
    response = error_response(exc.status, exc.code, exc.message)
    response.headers.update(exc.headers)
    return response


def require_role(role: Role, action: str | None = None) -> Callable[[View], View]:
    """Refuse the view to callers below `role`: 401 (with a Bearer challenge) or 403, in the API envelope.

    A refused POST/PUT/PATCH/DELETE writes an audit event with outcome 'denied' and action `action`
    (default: 'http.<endpoint>'). Example:

        @bp.post("/deployments")
        @require_role(Role.OPERATOR, action="deploy.start")
        def start_deployment(): ...
    """

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                check_access(role)
            except AuthError as exc:
                return refusal(exc, role, action)
            return view(*args, **kwargs)

        setattr(guarded, ACCESS, role)  # read by guard_request: this view checks for itself
        return guarded  # type: ignore[return-value]

    return decorate


def public(view: View) -> View:
    """Mark a view as open to anyone, whatever the method (login, logout); it must check what it needs itself."""
    setattr(view, ACCESS, PUBLIC)
    return view


def cross_site() -> str | None:
    """Say why this request comes from another site, by its Sec-Fetch-Site or Origin header; None when neither says so.

    NOTE: browsers send both on a POST (Sec-Fetch-Site since 2020-2023, Origin for longer); a client that is
    not a browser sends neither and is not refused. `none` is a request the user made (typed, bookmarked).
    The server's own origin is the one the request reached (scheme and Host, as seen behind
    FORWARDED_ALLOW_IPS) or FLIGHTDECK_PUBLIC_URL's.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site is {site!r}"
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    own = {f"{request.scheme}://{request.host}"}
    public_url = urlsplit(current_services().settings.public_url)
    if public_url.scheme and public_url.netloc:
        own.add(f"{public_url.scheme}://{public_url.netloc}")
    if origin.rstrip("/") not in own:
        return f"Origin {origin[:200]!r} is not this server's ({', '.join(sorted(own))})"
    return None


def guard_request() -> Response | None:
    """Before every request: the safety net for views without `require_role`, and FLIGHTDECK_AUTH_READS.

    First, a POST/PUT/PATCH/DELETE without a bearer token (a session cookie, or a login) that a browser
    says comes from another site is refused (403): login CSRF, and a second line behind the CSRF token.

    A POST/PUT/PATCH/DELETE to a view that declares nothing needs an operator, so a write nobody
    guarded is still never anonymous. With auth_reads on, GET/HEAD under /api/ needs a viewer.
    /v2 is left to the inference API's own check (FLIGHTDECK_INFERENCE_AUTH).
    """
    if request.path == "/v2" or request.path.startswith("/v2/"):
        return None
    if request.method in MUTATING and "Authorization" not in request.headers:
        elsewhere = cross_site()
        if elsewhere is not None:
            return refusal(Forbidden(f"a cross-site request is refused: {elsewhere}"))
    view = current_app.view_functions.get(request.endpoint or "")
    if view is None or getattr(view, ACCESS, None) is not None:
        return None
    if request.method in MUTATING:
        needed = Role.OPERATOR
    elif (
        request.method in READING
        and request.path.startswith("/api/")
        and request.path not in OPEN_READS
        and current_services().settings.auth_reads
    ):
        needed = Role.VIEWER
    else:
        return None
    try:
        check_access(needed)
    except AuthError as exc:
        return refusal(exc, needed)
    return None
