"""API tokens: created with a secret shown once, stored as its SHA-256, scoped by role, revocable.

A token's secret is `fd_` plus 43 URL-safe characters (256 random bits). Only its SHA-256 and its
first eight characters (for people to recognise it) are kept. Lookup is by the hash, so no stored
secret is ever compared with a guess character by character.

A token made with a token (its parent) never outranks it and never outlives it: it expires at the
parent's expiry at the latest, and revoking the parent revokes it (and its own children) too. A
runbook run's token is revoked when the run ends, so whatever the script made with it ends then.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from controlplane.auth.roles import Role
from controlplane.auth.users import check_grant, check_name
from controlplane.models import ApiToken, User

SECRET_PREFIX = "fd_"
SHOWN_PREFIX_LENGTH = 8
MAX_SECRET_LENGTH = 128
TOUCH_EVERY = timedelta(seconds=60)  # last_used_at is a hint; writing it on every request would cost a write each


def hash_secret(secret: str) -> str:
    """Return the SHA-256 hex digest stored for a token secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def effective_role(token: ApiToken, user: User) -> Role:
    """Return the lower of the token's role and its user's role now (a demoted user's tokens shrink too)."""
    return min(Role(token.role), Role(user.role))


def create_token(
    session: Session,
    user: User,
    name: str,
    role: Role,
    now: datetime,
    ttl_s: int | None = None,
    parent: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Add a token for `user` (not committed) and return it with its secret, which is never stored.

    `parent`: the token the request creating this one came with; the new token's role is at most
    the parent's and its expiry at most the parent's (a shorter `ttl_s` still wins).
    """
    check_name(name)
    check_grant(Role(user.role), role, "a token")
    expires_at = None if ttl_s is None else now + timedelta(seconds=ttl_s)
    if parent is not None:
        check_grant(Role(parent.role), role, "a token made with a token")
        if parent.expires_at is not None and (expires_at is None or parent.expires_at < expires_at):
            expires_at = parent.expires_at
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        user_id=user.id,
        name=name,
        token_hash=hash_secret(secret),
        prefix=secret[:SHOWN_PREFIX_LENGTH],
        role=Role(role).value,
        created_at=now,
        expires_at=expires_at,
        parent_id=None if parent is None else parent.id,
    )
    session.add(token)
    session.flush()
    return token, secret


def find_token(session: Session, secret: str, now: datetime) -> tuple[ApiToken, User] | None:
    """Return the live token for `secret` and its enabled user, or None (unknown, revoked, expired, disabled)."""
    if not secret.startswith(SECRET_PREFIX) or len(secret) > MAX_SECRET_LENGTH:
        return None
    row = session.execute(
        select(ApiToken, User).join(User, ApiToken.user_id == User.id).where(ApiToken.token_hash == hash_secret(secret))
    ).first()
    if row is None:
        return None
    token, user = row
    if token.revoked_at is not None or user.disabled:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    return token, user


def touch(session: Session, token_id: int, now: datetime) -> None:
    """Record that a token was used (not committed), at most once per TOUCH_EVERY."""
    session.execute(
        update(ApiToken)
        .where(ApiToken.id == token_id)
        .where(or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at < now - TOUCH_EVERY))
        .values(last_used_at=now)
    )


def revoke_token(session: Session, token: ApiToken, now: datetime) -> bool:
    """Revoke a token and every token made with it, down the line (not committed); False when it already was."""
    already = token.revoked_at is not None
    token.revoked_at = token.revoked_at or now
    # NOTE: children are revoked even when the parent already was, so a chain is never left half alive.
    parents = [token.id]
    while parents:
        children = list(session.scalars(select(ApiToken).where(ApiToken.parent_id.in_(parents))))
        for child in children:
            child.revoked_at = child.revoked_at or now
        parents = [child.id for child in children]
    session.flush()
    return not already


def list_tokens(session: Session, user_id: int | None = None) -> list[tuple[ApiToken, str]]:
    """Return (token, user name) pairs, newest first; only `user_id`'s when given."""
    query = select(ApiToken, User.name).join(User, ApiToken.user_id == User.id).order_by(ApiToken.id.desc())
    if user_id is not None:
        query = query.where(ApiToken.user_id == user_id)
    return [(token, name) for token, name in session.execute(query)]


def token_to_dict(token: ApiToken, user_name: str, now: datetime) -> dict[str, Any]:
    """Return the token as the API shows it: never the secret or its hash."""
    expired = token.expires_at is not None and token.expires_at <= now

    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "id": token.id,
        "name": token.name,
        "user": user_name,
        "prefix": token.prefix,
        "role": token.role,
        "created_at": iso(token.created_at),
        "expires_at": iso(token.expires_at),
        "revoked_at": iso(token.revoked_at),
        "last_used_at": iso(token.last_used_at),
        "active": token.revoked_at is None and not expired,
    }
