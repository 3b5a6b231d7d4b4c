"""Logging in with a name and password: the throttle, the check, the session, the audit trail.

One function shared by `POST /api/session` and the console's login form, so both refuse the
same way and leave the same audit events.
"""

from __future__ import annotations

import math

from sqlalchemy.orm import Session

from controlplane.auth import users
from controlplane.auth.audit import record_event
from controlplane.auth.errors import TooManyAttempts, Unauthorized
from controlplane.auth.guard import current_actor, start_session
from controlplane.auth.roles import Actor
from controlplane.auth.throttle import LoginThrottle, throttle_key


def log_in(db: Session, throttle: LoginThrottle, name: str, password: str, address: str | None) -> Actor:
    """Check `name` and `password` and start a session; raise TooManyAttempts or Unauthorized. Commits."""
    key = throttle_key(name, address)
    wait = throttle.retry_after(key)
    if wait:
        # NOTE: refused before the password is checked, so a locked-out guesser learns nothing.
        record_event(db, None, "auth.login", name, "denied", {"reason": "throttled", "retry_after_s": math.ceil(wait)})
        db.commit()
        raise TooManyAttempts(f"too many failed logins; try again in {math.ceil(wait)} s", math.ceil(wait))
    user, reason = users.authenticate(db, name, password)
    if user is None:
        lockout = throttle.failed(key)
        detail = {"reason": reason, "failures": throttle.failures(key)}
        if lockout:
            detail["locked_for_s"] = math.ceil(lockout)
        record_event(db, None, "auth.login", name, "denied", detail)
        db.commit()
        raise Unauthorized("wrong name or password")
    throttle.succeeded(key)
    start_session(user)
    actor = current_actor()
    assert actor is not None  # start_session set it
    record_event(db, actor, "auth.login", user.name, "ok")
    db.commit()
    return actor
