"""Logging in with a name and password: the throttle, the check, the session, the audit trail.

One function shared by `POST /api/session` and the console's login form, so both refuse the
same way and leave the same audit events. The trail never keeps what was typed as a name unless
an account has that name (people type passwords into the name field): an unknown name is recorded
as UNKNOWN_NAME with a keyed hash, so repeated attempts with one name can still be correlated.
A wrong password and an unknown name are one reason, `bad_credentials`, to anyone reading it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any

from flask import current_app
from sqlalchemy.orm import Session

from controlplane.auth import users
from controlplane.auth.audit import record_event
from controlplane.auth.errors import TooManyAttempts, Unauthorized
from controlplane.auth.guard import current_actor, start_session
from controlplane.auth.roles import Actor
from controlplane.auth.throttle import LoginThrottle, throttle_key

UNKNOWN_NAME = "unknown name"
BAD_CREDENTIALS = "bad_credentials"


def name_digest(name: str) -> str:
    """Return a keyed hash of a typed name: equal names match, and nobody without the secret can test guesses."""
    key = str(current_app.secret_key or "").encode()
    return hmac.new(key, name.casefold().encode(), hashlib.sha256).hexdigest()[:16]


def _has_account(db: Session, name: str) -> bool:
    """Say whether `name` is an account that may log in (what `users.authenticate` calls a known user)."""
    return users.login_account(db, name) is not None


def _recorded_name(name: str, known: bool, detail: dict[str, Any]) -> str:
    """Return the audit target for a typed name: itself when an account has it, else UNKNOWN_NAME (hash in detail)."""
    if known:
        return name
    detail["name_hash"] = name_digest(name)
    return UNKNOWN_NAME


def log_in(db: Session, throttle: LoginThrottle, name: str, password: str, address: str | None) -> Actor:
    """Check `name` and `password` and start a session; raise TooManyAttempts or Unauthorized. Commits."""
    key = throttle_key(name, address)
    wait = throttle.retry_after(key)
    if wait:
        # NOTE: refused before the password is checked, so a locked-out guesser learns nothing.
        detail: dict[str, Any] = {"reason": "throttled", "retry_after_s": math.ceil(wait)}
        record_event(db, None, "auth.login", _recorded_name(name, _has_account(db, name), detail), "denied", detail)
        db.commit()
        raise TooManyAttempts(f"too many failed logins; try again in {math.ceil(wait)} s", math.ceil(wait))
    user, reason = users.authenticate(db, name, password)
    if user is None:
        lockout = throttle.failed(key)
        detail = {"reason": "disabled" if reason == "disabled" else BAD_CREDENTIALS, "failures": throttle.failures(key)}
        if lockout:
            detail["locked_for_s"] = math.ceil(lockout)
        # NOTE: authenticate already looked the name up: "unknown_user" is exactly "no such account".
        known = reason != "unknown_user"
        record_event(db, None, "auth.login", _recorded_name(name, known, detail), "denied", detail)
        db.commit()
        raise Unauthorized("wrong name or password")
    throttle.succeeded(key)
    start_session(user)
    actor = current_actor()
    assert actor is not None  # start_session set it
    record_event(db, actor, "auth.login", user.name, "ok")
    db.commit()
    return actor
