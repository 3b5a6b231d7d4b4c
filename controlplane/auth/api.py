"""The access API: /api/session (login, logout, who am I), /api/users (and their sessions), /api/tokens, /api/audit.

Registering this blueprint also installs the app-wide checks (`guard.guard_request`), the
handler that puts WWW-Authenticate and Retry-After on access errors, the login throttle, and
the session cookie's flags (HttpOnly, SameSite=Lax, Secure per FLIGHTDECK_COOKIE_SECURE).
Bodies and answers are typed in `auth.schemas`; the contract parses each body before the view runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from flask import Blueprint, Response, request
from flask.blueprints import BlueprintSetupState
from pydantic import BaseModel

from controlplane.auth import login_sessions, tokens, users
from controlplane.auth.audit import audited, event_to_dict, list_events, record_event, refusals_recorded
from controlplane.auth.cookies import init_cookies
from controlplane.auth.errors import AuthError, Forbidden
from controlplane.auth.guard import (
    csrf_ok,
    csrf_token,
    current_actor,
    end_session,
    guard_request,
    public,
    refusal,
    require_role,
)
from controlplane.auth.login import log_in
from controlplane.auth.roles import Actor, Role
from controlplane.auth.schemas import (
    AuditEvents,
    AuditQuery,
    Login,
    SessionList,
    TokenAnswer,
    TokenCreate,
    TokenCreated,
    TokenList,
    UserAnswer,
    UserChange,
    UserCreate,
    UserList,
    Whoami,
)
from controlplane.auth.throttle import THROTTLE, LoginThrottle, current_throttle
from controlplane.context import app_services, current_services, get_db
from controlplane.contract import operation, parse_body
from controlplane.errorhandlers import error_response
from controlplane.errors import NotFound
from controlplane.models import ApiToken, User

bp = Blueprint("auth", __name__, url_prefix="/api")
View = TypeVar("View", bound=Callable[..., Any])

bp.before_app_request(guard_request)


@bp.record_once
def _setup(state: BlueprintSetupState) -> None:
    app = state.app
    settings = app_services(app).settings
    sessions = app_services(app).sessions
    app.extensions.setdefault(THROTTLE, LoginThrottle(sessions, settings.login_max_failures, settings.login_lockout_s))
    init_cookies(app, settings.cookie_secure, timedelta(hours=settings.session_hours))


@bp.app_errorhandler(AuthError)
def _auth_error(exc: AuthError) -> Response:
    response = error_response(exc.status, exc.code, exc.message)
    response.headers.update(exc.headers)
    return response


def _now() -> datetime:
    return datetime.now(UTC)


def _actor() -> Actor:
    actor = current_actor()
    assert actor is not None  # require_role let the request through
    return actor


def _refused_body_audited(action: str, model: type[BaseModel], target: Callable[..., str]) -> Callable[[View], View]:
    """Leave an 'error' event when the body is refused, as a change refused inside `audited` does (goes above `operation`).

    `target(**view_kwargs)` names what the change was aimed at. The body is parsed here once more
    only to learn whether it is refused; `operation` then parses it for the view.
    """

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def checked(*args: Any, **kwargs: Any) -> Any:
            with refusals_recorded(get_db(), _actor(), action, target(**kwargs)):
                parse_body(model)
            return view(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


def _typed_name() -> str:
    try:
        raw = request.get_json(silent=True)
    except (
        RecursionError
    ):  # NOTE: silent covers ValueError only; json's nesting limit raises this (a 400 from the contract)
        return ""
    return raw["name"] if isinstance(raw, dict) and isinstance(raw.get("name"), str) else ""


def _whoami(actor: Actor | None) -> dict[str, Any]:
    if actor is None:
        return {"authenticated": False, "user": None, "role": None, "kind": None, "token_id": None, "csrf_token": None}
    return {
        "authenticated": True,
        "user": actor.name,
        "role": actor.role.value,
        "kind": "session" if actor.kind == "user" else actor.kind,
        "token_id": actor.token_id,
        "csrf_token": csrf_token() if actor.kind == "user" else None,
    }


# --- session -------------------------------------------------------------------------------------


@bp.post("/session")
@public
@operation(
    body=Login, response=Whoami,
    errors={401: "Wrong name or password", 429: "Too many failed logins from this address (Retry-After)"},
)  # fmt: skip
def login(body: Login) -> dict[str, Any]:
    """Log in with a name and password: sets the session cookie and returns the CSRF token."""
    actor = log_in(get_db(), current_throttle(), body.name, body.password.get_secret_value(), request.remote_addr)
    return _whoami(actor)


@bp.get("/session")
@public
@operation(response=Whoami)
def whoami() -> dict[str, Any]:
    """Say who the request is authenticated as, and the session's CSRF token."""
    return _whoami(current_actor())


@bp.delete("/session")
@public
@operation(status=204, errors={403: "Logged in, but the X-CSRF-Token header is missing or wrong"})
def logout() -> Response | tuple[str, int]:
    """Log out of the session cookie (needs the CSRF token when logged in)."""
    actor = current_actor()
    if actor is not None and actor.kind == "user":
        if not csrf_ok():
            return refusal(Forbidden("logging out needs the X-CSRF-Token header"), None, "auth.logout")
        db = get_db()
        record_event(db, actor, "auth.logout", actor.name, "ok")
        db.commit()
    end_session()
    return "", 204


# --- users ---------------------------------------------------------------------------------------


@bp.get("/users")
@require_role(Role.ADMIN)
@operation(response=UserList)
def list_users() -> dict[str, Any]:
    """List every user (admin)."""
    return {"users": [users.user_to_dict(u) for u in users.list_users(get_db())]}


@bp.post("/users")
@require_role(Role.ADMIN, action="user.create")
@_refused_body_audited("user.create", UserCreate, _typed_name)
@operation(body=UserCreate, response=UserAnswer, status=201, errors={409: "A user has that name"})
def create_user(body: UserCreate) -> tuple[dict[str, Any], int]:
    """Create a user with a name, password and role (admin)."""
    db = get_db()
    with audited(db, _actor(), "user.create", body.name) as event:
        event.detail["role"] = body.role.value
        user = users.create_user(db, body.name, body.password.get_secret_value(), body.role, _now())
    return {"user": users.user_to_dict(user)}, 201


@bp.patch("/users/<name>")
@require_role(Role.ADMIN, action="user.update")
@_refused_body_audited("user.update", UserChange, lambda name: name)
@operation(
    body=UserChange, response=UserAnswer, path={"name": "the user's name"},
    errors={404: "No such user", 409: "It would leave no enabled admin"},
)  # fmt: skip
def update_user(name: str, body: UserChange) -> dict[str, Any]:
    """Change a user's role, disabled flag or password (admin); their login sessions end."""
    db = get_db()
    with audited(db, _actor(), "user.update", name) as event:
        user = users.get_user(db, name)
        if user is None:
            raise NotFound(f"no user named {name!r}")
        password = body.password.get_secret_value() if body.password is not None else None
        event.detail.update(users.update_user(db, user, role=body.role, disabled=body.disabled, password=password))
    return {"user": users.user_to_dict(user)}


def _user_named(name: str) -> User:
    user = users.get_user(get_db(), name)
    if user is None:
        raise NotFound(f"no user named {name!r}")
    return user


def _idle() -> timedelta:
    return timedelta(minutes=current_services().settings.session_idle_minutes)


@bp.get("/users/<name>/sessions")
@require_role(Role.ADMIN)
@operation(response=SessionList, path={"name": "the user's name"}, errors={404: "No such user"})
def list_user_sessions(name: str) -> dict[str, Any]:
    """List a user's live console logins, most recently used first (admin); never their ids."""
    idle = _idle()
    rows = login_sessions.live_sessions(get_db(), _user_named(name).id, _now(), idle)
    return {"sessions": [login_sessions.session_to_dict(r, idle) for r in rows]}


@bp.delete("/users/<name>/sessions/<int:session_id>")
@require_role(Role.ADMIN, action="session.revoke")
@operation(
    status=204, path={"name": "the user's name", "session_id": "the session's number, from the list"},
    errors={404: "No such user, or no such session of theirs"},
)  # fmt: skip
def revoke_user_session(name: str, session_id: int) -> tuple[str, int]:
    """End one of a user's console logins at once, in every process (admin)."""
    db = get_db()
    with audited(db, _actor(), "session.revoke", name) as event:
        event.detail["session"] = session_id
        if not login_sessions.revoke(db, _user_named(name).id, session_id):
            raise NotFound(f"{name!r} has no session {session_id}")
    return "", 204


# --- tokens --------------------------------------------------------------------------------------


@bp.get("/tokens")
@require_role(Role.VIEWER)
@operation(response=TokenList)
def list_tokens() -> dict[str, Any]:
    """List the caller's tokens (an admin sees everyone's); never their secrets."""
    actor, now = _actor(), _now()
    owner = None if actor.role >= Role.ADMIN else actor.user_id
    rows = tokens.list_tokens(get_db(), owner)
    return {"tokens": [tokens.token_to_dict(t, user, now) for t, user in rows]}


@bp.post("/tokens")
@require_role(Role.VIEWER, action="token.create")
@_refused_body_audited("token.create", TokenCreate, lambda: _actor().name)
@operation(
    body=TokenCreate, response=TokenCreated, status=201,
    errors={403: "The role asked for is above the caller's (or the calling token's)"},
)  # fmt: skip
def create_token(body: TokenCreate) -> tuple[dict[str, Any], int, dict[str, str]]:
    """Create a token for the caller, with a role up to the caller's; the secret is in this answer only."""
    db, actor, now = get_db(), _actor(), _now()
    user = db.get(User, actor.user_id)
    role = body.role or actor.role
    with audited(db, actor, "token.create", actor.name) as event:
        event.detail.update(name=body.name, role=role.value, ttl_s=body.ttl_s)
        # A token made with a token cannot outrank the token it was made with.
        users.check_grant(actor.role, role, "a token")
        parent = db.get(ApiToken, actor.token_id) if actor.token_id is not None else None
        token, secret = tokens.create_token(db, user, body.name, role, now, body.ttl_s, parent)  # never outlives it
        event.detail.update(token_id=token.id, prefix=token.prefix)
    answer = {"token": tokens.token_to_dict(token, actor.name, now), "secret": secret}
    return answer, 201, {"Cache-Control": "no-store"}


@bp.delete("/tokens/<int:token_id>")
@require_role(Role.VIEWER, action="token.revoke")
@operation(
    response=TokenAnswer, path={"token_id": "the token's id"},
    errors={403: "Neither the token's owner nor an admin", 404: "No such token"},
)  # fmt: skip
def revoke_token(token_id: int) -> dict[str, Any]:
    """Revoke a token (its owner or an admin), and every token made with it."""
    db, actor, now = get_db(), _actor(), _now()
    with audited(db, actor, "token.revoke", str(token_id)) as event:
        token = db.get(ApiToken, token_id)
        if token is None:
            raise NotFound(f"no token {token_id}")
        if token.user_id != actor.user_id and actor.role < Role.ADMIN:
            raise Forbidden("only the token's owner or an admin can revoke it")
        if not tokens.revoke_token(db, token, now):
            event.detail["already_revoked"] = True
        owner = db.get(User, token.user_id)
    return {"token": tokens.token_to_dict(token, owner.name if owner else "?", now)}


# --- audit ---------------------------------------------------------------------------------------


@bp.get("/audit")
@require_role(Role.VIEWER)
@operation(query=AuditQuery, response=AuditEvents)
def audit(query: AuditQuery) -> dict[str, Any]:
    """List audit events, newest first, filtered by time, actor, action (a trailing * matches a prefix) and outcome."""
    events = list_events(
        get_db(), since=query.since, actor=query.actor, action=query.action, outcome=query.outcome, limit=query.limit
    )
    return {"events": [event_to_dict(e) for e in events]}
