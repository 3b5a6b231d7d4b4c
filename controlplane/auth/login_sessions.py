"""Server-side login sessions: the cookie carries a random id; the database says whether it still counts.

A login adds a row keyed by the SHA-256 of a 256-bit random id; the signed cookie carries the id
itself. Nothing in the cookie is derived from the password hash, so knowing the signing secret and
a user's hash is not enough to forge a login: the id must name a row. Deleting the row (logout, a
password or role change, disabling the user) ends the session at once in every process and on
every node sharing the database. Each session also ends at its absolute expiry
(FLIGHTDECK_SESSION_HOURS after the login) and when unused for FLIGHTDECK_SESSION_IDLE_MINUTES; an
ended row is deleted when next presented. Last use is written at most once per TOUCH_EVERY, so
a busy console costs one small write a minute, not one per request; the idle timeout is exact to
within that minute.

The reserved identities (`system`, `anonymous`) never get a row: they cannot log in.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from controlplane.auth.roles import RESERVED
from controlplane.models import LoginSession, User

MAX_ID_LENGTH = 128
TOUCH_EVERY = timedelta(seconds=60)  # as tokens: last use is a minute-grained clock, not a write per request


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def can_log_in(user: User) -> bool:
    """Return whether `user` may hold a session at all: enabled and not a reserved identity."""
    return not user.disabled and user.name.lower() not in RESERVED


def open_session(
    db: Session,
    user: User,
    now: datetime,
    lifetime: timedelta,
    address: str | None = None,
    user_agent: str | None = None,
) -> str:
    """Add a session for `user` (not committed) and return its id for the cookie; never stored as is."""
    if not can_log_in(user):
        raise ValueError(f"{user.name!r} cannot hold a session")
    # Forget this user's expired sessions while here, so the table holds only live ones (and a few stale).
    db.execute(delete(LoginSession).where(LoginSession.user_id == user.id, LoginSession.expires_at <= now))
    session_id = secrets.token_urlsafe(32)
    db.add(
        LoginSession(
            user_id=user.id, id_hash=_digest(session_id), created_at=now, expires_at=now + lifetime,
            last_used_at=now, address=address[:64] if address else None,
            user_agent=user_agent[:256] if user_agent else None,
        )
    )  # fmt: skip
    db.flush()
    return session_id


def last_used(login: LoginSession) -> datetime:
    """Return when a session was last seen in use (its creation, before any use was recorded)."""
    return login.last_used_at or login.created_at


def is_live(login: LoginSession, user: User, now: datetime, idle: timedelta | None = None) -> bool:
    """Return whether a session still counts: before its absolute expiry, used within `idle`, its user able to log in."""
    if login.expires_at <= now or not can_log_in(user):
        return False
    return idle is None or last_used(login) > now - idle


def touch_due(login: LoginSession, now: datetime) -> bool:
    """Return whether this use should be written down (the last one recorded is over TOUCH_EVERY old)."""
    return last_used(login) < now - TOUCH_EVERY


def find_login(db: Session, session_id: str) -> tuple[LoginSession, User] | None:
    """Return the session row with this id and its user, live or not, or None when no row has it."""
    if not session_id or len(session_id) > MAX_ID_LENGTH:
        return None
    row = db.execute(
        select(LoginSession, User)
        .join(User, LoginSession.user_id == User.id)
        .where(LoginSession.id_hash == _digest(session_id))
    ).first()
    return None if row is None else (row[0], row[1])


def find_session(db: Session, session_id: str, now: datetime, idle: timedelta | None = None) -> User | None:
    """Return the user of a live session with this id, or None (unknown, ended, expired, idle, user disabled)."""
    found = find_login(db, session_id)
    if found is None or not is_live(*found, now, idle):
        return None
    return found[1]


def touch(db: Session, login_id: int, now: datetime) -> None:
    """Record that a session was used (not committed), at most once per TOUCH_EVERY even when several race."""
    db.execute(
        update(LoginSession)
        .where(LoginSession.id == login_id)
        .where(or_(LoginSession.last_used_at.is_(None), LoginSession.last_used_at < now - TOUCH_EVERY))
        .values(last_used_at=now)
    )


def end_session(db: Session, session_id: str) -> bool:
    """Delete the session with this id (not committed); return whether there was one."""
    return bool(db.execute(delete(LoginSession).where(LoginSession.id_hash == _digest(session_id))).rowcount)


def end_user_sessions(db: Session, user_id: int) -> int:
    """Delete every session of a user (not committed); return how many there were."""
    return db.execute(delete(LoginSession).where(LoginSession.user_id == user_id)).rowcount or 0


def live_sessions(db: Session, user_id: int, now: datetime, idle: timedelta | None = None) -> list[LoginSession]:
    """Return a user's live sessions, the most recently used first."""
    rows = db.scalars(select(LoginSession).where(LoginSession.user_id == user_id, LoginSession.expires_at > now))
    return sorted((r for r in rows if idle is None or last_used(r) > now - idle), key=last_used, reverse=True)


def count_sessions(db: Session, user_id: int, now: datetime, idle: timedelta | None = None) -> int:
    """Return how many live sessions a user has."""
    return len(live_sessions(db, user_id, now, idle))


def revoke(db: Session, user_id: int, login_id: int) -> bool:
    """Delete one session of a user by its row number (not committed); return whether it was theirs and there."""
    ended = db.execute(delete(LoginSession).where(LoginSession.id == login_id, LoginSession.user_id == user_id))
    return bool(ended.rowcount)


def session_to_dict(login: LoginSession, idle: timedelta | None = None) -> dict[str, object]:
    """Describe a session for an admin: its row number, times, address and agent; never its id or hash."""
    ends = login.expires_at if idle is None else min(login.expires_at, last_used(login) + idle)
    return {
        "id": login.id, "created_at": login.created_at.isoformat(), "last_used_at": last_used(login).isoformat(),
        "expires_at": ends.isoformat(), "address": login.address, "user_agent": login.user_agent,
    }  # fmt: skip
