"""Server-side login sessions: the cookie carries a random id; the database says whether it still counts.

A login adds a row keyed by the SHA-256 of a 256-bit random id; the signed cookie carries the id
itself. Nothing in the cookie is derived from the password hash, so knowing the signing secret and
a user's hash is not enough to forge a login: the id must name a row. Deleting the row (logout, a
password or role change, disabling the user) ends the session at once in every process and on
every node sharing the database. Each session also ends at its absolute expiry.

The reserved identities (`system`, `anonymous`) never get a row: they cannot log in.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controlplane.auth.users import RESERVED
from controlplane.models import LoginSession, User

MAX_ID_LENGTH = 128


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def can_log_in(user: User) -> bool:
    """Return whether `user` may hold a session at all: enabled and not a reserved identity."""
    return not user.disabled and user.name.lower() not in RESERVED


def open_session(db: Session, user: User, now: datetime, lifetime: timedelta) -> str:
    """Add a session for `user` (not committed) and return its id for the cookie; never stored as is."""
    if not can_log_in(user):
        raise ValueError(f"{user.name!r} cannot hold a session")
    # Forget this user's expired sessions while here, so the table holds only live ones (and a few stale).
    db.execute(delete(LoginSession).where(LoginSession.user_id == user.id, LoginSession.expires_at <= now))
    session_id = secrets.token_urlsafe(32)
    db.add(LoginSession(user_id=user.id, id_hash=_digest(session_id), created_at=now, expires_at=now + lifetime))
    db.flush()
    return session_id


def find_session(db: Session, session_id: str, now: datetime) -> User | None:
    """Return the user of a live session with this id, or None (unknown, ended, expired, user disabled)."""
    if not session_id or len(session_id) > MAX_ID_LENGTH:
        return None
    row = db.execute(
        select(LoginSession, User)
        .join(User, LoginSession.user_id == User.id)
        .where(LoginSession.id_hash == _digest(session_id))
    ).first()
    if row is None:
        return None
    login, user = row
    if login.expires_at <= now or not can_log_in(user):
        return None
    return user


def end_session(db: Session, session_id: str) -> bool:
    """Delete the session with this id (not committed); return whether there was one."""
    return bool(db.execute(delete(LoginSession).where(LoginSession.id_hash == _digest(session_id))).rowcount)


def end_user_sessions(db: Session, user_id: int) -> int:
    """Delete every session of a user (not committed); return how many there were."""
    return db.execute(delete(LoginSession).where(LoginSession.user_id == user_id)).rowcount or 0


def count_sessions(db: Session, user_id: int, now: datetime) -> int:
    """Return how many live sessions a user has."""
    rows = db.scalars(select(LoginSession.id).where(LoginSession.user_id == user_id, LoginSession.expires_at > now))
    return len(rows.all())
