"""Accounts and the audit trail: users, their API tokens, and one event per mutating action."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Double, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models import Base


class User(Base):
    """A person (or a service account) who logs in; role is a controlplane.auth.Role value."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))  # werkzeug's scrypt form, never the password
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    disabled: Mapped[bool] = mapped_column(default=False)


class ApiToken(Base):
    """A bearer token for scripts: only the SHA-256 of its secret is kept; its role never exceeds its user's."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    prefix: Mapped[str] = mapped_column(String(8))  # the secret's first characters, for people to recognise it
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    # The token this one was made with: it never outlives or outranks it, and is revoked with it.
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"), index=True)


class LoginSession(Base):
    """A console or API login: the cookie carries a random id, only its SHA-256 is kept; deleting the row logs out."""

    __tablename__ = "login_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    id_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the cookie's session id
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)
    # The idle timeout's clock: written at most once per TOUCH_EVERY, not on every request (None: since created_at).
    last_used_at: Mapped[datetime | None]
    address: Mapped[str | None] = mapped_column(String(64))  # where the login came from, shown to admins
    user_agent: Mapped[str | None] = mapped_column(String(256))


class AuditEvent(Base):
    """Who did what, when, from where, and how it ended ('ok', 'denied' or 'error'); detail holds no secrets."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    ts: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    actor_kind: Mapped[str] = mapped_column(String(16))  # user, token, system or cli
    action: Mapped[str] = mapped_column(String(64))  # e.g. model.push, deploy.start, token.create, auth.login
    target: Mapped[str] = mapped_column(String(256), default="")
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict] = mapped_column(JSON, default=dict)
    address: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(String(128))


class LoginFailure(Base):
    """Recent failed logins for one name from one address, shared by every process (the login throttle).

    The key is a SHA-256 of the name and address, so a password typed into the name field is not kept.
    Times are seconds since the epoch from the throttle's clock.
    """

    __tablename__ = "login_failures"

    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    failures: Mapped[int]
    last_at: Mapped[float] = mapped_column(Double, index=True)
    locked_until: Mapped[float] = mapped_column(Double)
