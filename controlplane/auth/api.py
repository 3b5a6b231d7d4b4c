"""The access API: /api/session (login, logout, who am I), /api/users, /api/tokens, /api/audit.

Registering this blueprint also installs the app-wide checks (`guard.guard_request`), the
handler that puts WWW-Authenticate and Retry-After on access errors, the login throttle, and
the session cookie's flags (HttpOnly, SameSite=Lax, Secure per FLIGHTDECK_COOKIE_SECURE).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, Response, jsonify, request
from flask.blueprints import BlueprintSetupState

from controlplane.auth import tokens, users
from controlplane.auth.audit import MAX_LIMIT, audited, event_to_dict, list_events, record_event
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
from controlplane.auth.throttle import THROTTLE, LoginThrottle, current_throttle
from controlplane.context import app_services
from controlplane.db import get_db
from controlplane.errors import ApiError, NotFound, error_response
from controlplane.models import ApiToken, User
from controlplane.timeparse import parse_time

bp = Blueprint("auth", __name__, url_prefix="/api")
MAX_TTL_S = 10 * 366 * 24 * 3600

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


def _body(allowed: set[str]) -> dict[str, Any]:
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ApiError(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    return data


def _actor() -> Actor:
    actor = current_actor()
    assert actor is not None  # require_role let the request through
    return actor


def _whoami(actor: Actor | None) -> dict[str, Any]:
    if actor is None:
        return {"authenticated": False, "user": None, "role": None, "kind": None, "csrf_token": None}
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
def login() -> Response:
    """Check a name and password; on success set the session cookie and return the CSRF token."""
    body = _body({"name", "password"})
    name, password = body.get("name"), body.get("password")
    if not isinstance(name, str) or not name:
        raise ApiError("'name' is required (a string)")
    if not isinstance(password, str) or not password:
        raise ApiError("'password' is required (a string)")
    actor = log_in(get_db(), current_throttle(), name, password, request.remote_addr)
    return jsonify(_whoami(actor))


@bp.get("/session")
@public
def whoami() -> Response:
    """Say who the request is authenticated as, and the session's CSRF token."""
    return jsonify(_whoami(current_actor()))


@bp.delete("/session")
@public
def logout() -> Response:
    """Log out of the session cookie (needs the CSRF token when logged in)."""
    actor = current_actor()
    if actor is not None and actor.kind == "user":
        if not csrf_ok():
            return refusal(Forbidden("logging out needs the X-CSRF-Token header"), None, "auth.logout")
        db = get_db()
        record_event(db, actor, "auth.logout", actor.name, "ok")
        db.commit()
    end_session()
    return Response(status=204)


# --- users ---------------------------------------------------------------------------------------


@bp.get("/users")
@require_role(Role.ADMIN)
def list_users() -> Response:
    """List every user (admin)."""
    return jsonify({"users": [users.user_to_dict(u) for u in users.list_users(get_db())]})


@bp.post("/users")
@require_role(Role.ADMIN, action="user.create")
def create_user() -> tuple[Response, int]:
    """Create a user with a name, password and role (admin)."""
    db = get_db()
    raw = request.get_json(silent=True)
    target = raw.get("name") if isinstance(raw, dict) and isinstance(raw.get("name"), str) else ""
    with audited(db, _actor(), "user.create", target) as event:
        body = _body({"name", "password", "role"})
        name = users.check_name(body.get("name"))
        password = users.check_password(body.get("password"))
        role = users.check_role(body.get("role", Role.VIEWER.value))
        event.detail["role"] = role.value
        user = users.create_user(db, name, password, role, _now())
    return jsonify({"user": users.user_to_dict(user)}), 201


@bp.patch("/users/<name>")
@require_role(Role.ADMIN, action="user.update")
def update_user(name: str) -> Response:
    """Change a user's role, disabled flag or password (admin)."""
    db = get_db()
    with audited(db, _actor(), "user.update", name) as event:
        body = _body({"role", "disabled", "password"})
        if not body:
            raise ApiError("give at least one of 'role', 'disabled', 'password'")
        role = users.check_role(body["role"]) if "role" in body else None
        disabled = body.get("disabled")
        if disabled is not None and not isinstance(disabled, bool):
            raise ApiError("'disabled' must be true or false")
        password = users.check_password(body["password"]) if "password" in body else None
        user = users.get_user(db, name)
        if user is None:
            raise NotFound(f"no user named {name!r}")
        event.detail.update(users.update_user(db, user, role=role, disabled=disabled, password=password))
    return jsonify({"user": users.user_to_dict(user)})


# --- tokens --------------------------------------------------------------------------------------


@bp.get("/tokens")
@require_role(Role.VIEWER)
def list_tokens() -> Response:
    """List the caller's tokens (an admin sees everyone's); never their secrets."""
    actor, now = _actor(), _now()
    owner = None if actor.role >= Role.ADMIN else actor.user_id
    rows = tokens.list_tokens(get_db(), owner)
    return jsonify({"tokens": [tokens.token_to_dict(t, user, now) for t, user in rows]})


@bp.post("/tokens")
@require_role(Role.VIEWER, action="token.create")
def create_token() -> tuple[Response, int]:
    """Create a token for the caller, with a role up to the caller's; the secret is in this answer only."""
    db, actor, now = get_db(), _actor(), _now()
    user = db.get(User, actor.user_id)
    with audited(db, actor, "token.create", actor.name) as event:
        body = _body({"name", "role", "ttl_s"})
        name = users.check_name(body.get("name"))
        role = users.check_role(body.get("role", actor.role.value))
        ttl_s = body.get("ttl_s")
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 0 < ttl_s <= MAX_TTL_S):
            raise ApiError(f"'ttl_s' must be a whole number of seconds from 1 to {MAX_TTL_S}")
        event.detail.update(name=name, role=role.value, ttl_s=ttl_s)
        # A token made with a token cannot outrank the token it was made with.
        users.check_grant(actor.role, role, "a token")
        parent = db.get(ApiToken, actor.token_id) if actor.token_id is not None else None
        token, secret = tokens.create_token(db, user, name, role, now, ttl_s, parent)  # never outlives its parent
        event.detail.update(token_id=token.id, prefix=token.prefix)
    response = jsonify({"token": tokens.token_to_dict(token, actor.name, now), "secret": secret})
    response.headers["Cache-Control"] = "no-store"
    return response, 201


@bp.delete("/tokens/<int:token_id>")
@require_role(Role.VIEWER, action="token.revoke")
def revoke_token(token_id: int) -> Response:
    """Revoke a token (its owner or an admin)."""
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
    return jsonify({"token": tokens.token_to_dict(token, owner.name if owner else "?", now)})


# --- audit ---------------------------------------------------------------------------------------


@bp.get("/audit")
@require_role(Role.VIEWER)
def audit() -> Response:
    """List audit events, newest first: ?since= &actor= &action= (a trailing * matches a prefix) &outcome= &limit=."""
    args = request.args
    since = parse_time(args["since"], "since", _now()) if args.get("since") else None
    raw_limit = args.get("limit", "100")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise ApiError(f"'limit' must be a whole number from 1 to {MAX_LIMIT}; got {raw_limit!r}")
    outcome = args.get("outcome")
    if outcome is not None and outcome not in ("ok", "denied", "error"):
        raise ApiError(f"'outcome' must be ok, denied or error; got {outcome!r}")
    events = list_events(
        get_db(),
        since=since,
        actor=args.get("actor") or None,
        action=args.get("action") or None,
        outcome=outcome,
        limit=int(raw_limit),
    )
    return jsonify({"events": [event_to_dict(e) for e in events]})
