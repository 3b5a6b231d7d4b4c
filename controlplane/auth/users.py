"""User accounts: create, change, list, and check a name and password."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.auth import login_sessions
from controlplane.auth.errors import Forbidden
from controlplane.auth.passwords import MAX_LENGTH, MIN_LENGTH, burn_verify_time, hash_password, verify_password
from controlplane.auth.roles import RESERVED, Role, parse_role
from controlplane.errors import ApiError, Conflict
from controlplane.models import User

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def check_name(value: object, field: str = "name") -> str:
    """Return `value` if it is a usable account or token name, else raise a 400 naming `field`."""
    if not isinstance(value, str) or not NAME.match(value):
        raise ApiError(f"'{field}' must be 1-64 letters, digits or _ . @ - (starting with a letter or digit)")
    return value


def check_password(value: object, field: str = "password") -> str:
    """Return `value` if it is an acceptable new password, else raise a 400 naming `field`."""
    if not isinstance(value, str) or not MIN_LENGTH <= len(value) <= MAX_LENGTH:
        raise ApiError(f"'{field}' must be a string of {MIN_LENGTH} to {MAX_LENGTH} characters")
    return value


def check_role(value: object, field: str = "role") -> Role:
    """Return the Role named by `value`, else raise a 400 naming `field`."""
    role = parse_role(value)
    if role is None:
        raise ApiError(f"'{field}' must be one of {[r.value for r in Role]}; got {value!r}")
    return role


def get_user(session: Session, name: str) -> User | None:
    """Return the user called `name`, or None."""
    return session.scalar(select(User).where(User.name == name))


def list_users(session: Session) -> list[User]:
    """Return every user, by name."""
    return list(session.scalars(select(User).order_by(User.name)))


def count_users(session: Session) -> int:
    """Return how many users exist."""
    return session.scalar(select(func.count()).select_from(User)) or 0


def create_user(session: Session, name: str, password: str, role: Role, now: datetime) -> User:
    """Add a user with a hashed password (not committed); 409 when the name is taken."""
    check_name(name)
    check_password(password)
    if name.lower() in RESERVED:
        raise ApiError(f"'name' {name!r} is reserved")
    if get_user(session, name) is not None:
        raise Conflict(f"a user named {name!r} already exists")
    user = User(name=name, password_hash=hash_password(password), role=Role(role).value, created_at=now, disabled=False)
    session.add(user)
    session.flush()
    return user


def update_user(
    session: Session,
    user: User,
    *,
    role: Role | None = None,
    disabled: bool | None = None,
    password: str | None = None,
) -> dict[str, Any]:
    """Change a user's role, disabled flag or password (not committed); return what changed, without secrets.

    Any change ends the user's login sessions (tokens follow the user's role and disabled flag by
    themselves). Refuses (409) to leave no enabled admin, so nobody can lock everyone out by accident.
    """
    changes: dict[str, Any] = {}
    if role is not None and role.value != user.role:
        changes["role"] = {"from": user.role, "to": role.value}
        user.role = role.value
    if disabled is not None and disabled != user.disabled:
        changes["disabled"] = disabled
        user.disabled = disabled
    if password is not None:
        user.password_hash = hash_password(check_password(password))
        changes["password_changed"] = True
    if changes:
        # A new password, a new role or a disabled account: the user's logins end now, on every node.

        ended = login_sessions.end_user_sessions(session, user.id)
        if ended:
            changes["sessions_ended"] = ended
        session.flush()
        admins = session.scalar(
            select(func.count()).select_from(User).where(User.role == Role.ADMIN.value, User.disabled.is_(False))
        )
        if not admins:
            raise Conflict("at least one enabled admin must remain")
    return changes


def login_account(session: Session, name: str) -> User | None:
    """Return the account a login with `name` would check, or None (not a valid name, reserved, or no such user)."""
    return get_user(session, name) if NAME.match(name) and name.lower() not in RESERVED else None


def authenticate(session: Session, name: str, password: str) -> tuple[User | None, str]:
    """Return (user, 'ok') when name and password match an enabled user, else (None, why it failed).

    Why: 'unknown_user', 'bad_password' or 'disabled', for the caller to log, never to show. The
    reserved identities (the `system` account automatic runbooks act as) never log in, whatever
    their stored hash says.
    """
    user = login_account(session, name)
    if user is None:
        burn_verify_time(password)
        return None, "unknown_user"
    if not verify_password(user.password_hash, password):
        return None, "bad_password"
    if user.disabled:
        return None, "disabled"
    return user, "ok"


def check_grant(granter_role: Role, wanted: Role, what: str) -> None:
    """Raise 403 when `wanted` exceeds `granter_role` (a token's role never exceeds its user's)."""
    if wanted > granter_role:
        raise Forbidden(f"{what} cannot have the {wanted} role: it is above {granter_role}")


def user_to_dict(user: User) -> dict[str, Any]:
    """Return the user as the API shows it (never the password hash)."""
    return {
        "name": user.name,
        "role": user.role,
        "disabled": user.disabled,
        "created_at": user.created_at.isoformat(),
    }
