"""The access API's request and response models (`/api/session`, `/api/users` and their sessions, `/api/tokens`, `/api/audit`).

Names, passwords and roles are checked by the same functions the CLI uses (`users.check_*`), run
as before-validators, so a refusal reads exactly as it always has; the Field constraints beside
them are what the OpenAPI document shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator

from controlplane.auth import users
from controlplane.auth.audit import MAX_LIMIT, AuditOutcome
from controlplane.auth.passwords import MAX_LENGTH, MIN_LENGTH
from controlplane.auth.roles import Role
from controlplane.contract import QueryArgs, Reply, RequestBody, Timestamp
from controlplane.errors import ApiError
from controlplane.timeparse import TIME_SYNTAX, TimeText

MAX_TTL_S = 10 * 366 * 24 * 3600  # ten years: a token that long-lived should be a deliberate choice

UserName = Field(pattern=users.NAME.pattern, description="1-64 letters, digits or _ . @ - (a letter or digit first)")


# The CLI's own checks, run before the type's: a refusal reads as it always has.
CheckedName = Annotated[str, BeforeValidator(users.check_name)]
CheckedRole = Annotated[Role, BeforeValidator(users.check_role)]
CheckedPassword = Annotated[SecretStr, BeforeValidator(users.check_password)]


def _new_password(description: str, **default: Any) -> Any:
    return Field(min_length=MIN_LENGTH, max_length=MAX_LENGTH, description=description, **default)


# --- requests ------------------------------------------------------------------------------------


class Login(RequestBody):
    """A name and password to log in with."""

    name: str = Field(min_length=1)
    password: SecretStr = Field(min_length=1, description="never echoed, never logged")

    @field_validator("name", "password", mode="before")
    @classmethod
    def _given(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str) or not value:
            raise ApiError(f"'{info.field_name}' is required (a string)")
        return value


class UserCreate(RequestBody):
    """A new account."""

    name: CheckedName = UserName
    password: CheckedPassword = _new_password("the new account's password")
    role: CheckedRole = Role.VIEWER


class UserChange(RequestBody):
    """What to change on an account: any of role, disabled, password (changing anything ends its logins)."""

    role: CheckedRole | None = None
    disabled: bool | None = None
    password: CheckedPassword | None = _new_password("a new password", default=None)

    @field_validator("disabled", mode="before")
    @classmethod
    def _disabled(cls, value: object) -> object:
        if value is not None and not isinstance(value, bool):
            raise ApiError("'disabled' must be true or false")
        return value

    @model_validator(mode="after")
    def _something(self) -> UserChange:
        if not self.model_fields_set:
            raise ApiError("give at least one of 'role', 'disabled', 'password'")
        return self


class TokenCreate(RequestBody):
    """A token for the caller; its role defaults to the caller's and may not exceed it."""

    name: CheckedName = UserName
    role: CheckedRole | None = Field(None, description="default: the caller's role")
    ttl_s: int | None = Field(None, ge=1, le=MAX_TTL_S, description="seconds until it expires (default: never)")

    @field_validator("ttl_s", mode="before")
    @classmethod
    def _ttl(cls, value: object) -> object:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TTL_S):
            raise ApiError(f"'ttl_s' must be a whole number of seconds from 1 to {MAX_TTL_S}")
        return value


class AuditQuery(QueryArgs):
    """Filters over the audit trail, newest first."""

    since: TimeText | None = Field(None, description=f"only events at or after this time: {TIME_SYNTAX}")
    actor: str | None = Field(None, description="only this actor's events")
    action: str | None = Field(None, description="only this action; a trailing * matches a prefix ('user.*')")
    outcome: AuditOutcome | None = Field(None, description="only events that ended this way")
    limit: int = Field(100, ge=1, le=MAX_LIMIT, description="at most this many events")

    @field_validator("limit", mode="before")
    @classmethod
    def _limit(cls, value: object) -> object:
        if not (isinstance(value, str) and value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_LIMIT):
            raise ApiError(f"'limit' must be a whole number from 1 to {MAX_LIMIT}; got {value!r}")
        return value

    @field_validator("outcome", mode="before")
    @classmethod
    def _outcome(cls, value: object) -> object:
        if value not in ("ok", "denied", "error"):
            raise ApiError(f"'outcome' must be ok, denied or error; got {value!r}")
        return value

    @field_validator("since", mode="before")
    @classmethod
    def _since(cls, value: object) -> object:
        return value or None  # ?since= with nothing after it: from the beginning, as before

    @field_validator("actor", "action", mode="after")
    @classmethod
    def _blank_is_any(cls, value: str | None) -> str | None:
        return value or None  # ?actor= with nothing after it filters nothing, as before


# --- responses -----------------------------------------------------------------------------------


class Whoami(Reply):
    """Who the request is authenticated as; the CSRF token is for cookie sessions only."""

    authenticated: bool
    user: str | None
    role: Role | None
    kind: Literal["session", "token"] | None
    token_id: int | None
    csrf_token: str | None


class UserView(Reply):
    """An account, never its password hash."""

    name: str
    role: Role
    disabled: bool
    created_at: Timestamp


class UserAnswer(Reply):
    user: UserView


class UserList(Reply):
    users: list[UserView]


class TokenView(Reply):
    """A token, never its secret or hash."""

    id: int
    name: str
    user: str = Field(description="its owner")
    prefix: str = Field(description="the secret's first characters, to tell tokens apart")
    role: Role
    created_at: Timestamp | None
    expires_at: Timestamp | None
    revoked_at: Timestamp | None
    last_used_at: Timestamp | None
    active: bool = Field(description="neither revoked nor expired")


class TokenAnswer(Reply):
    token: TokenView


class TokenCreated(Reply):
    """The new token and its secret: shown in this answer only."""

    token: TokenView
    secret: str = Field(description="send as 'Authorization: Bearer <secret>'; it cannot be shown again")


class TokenList(Reply):
    tokens: list[TokenView]


class SessionView(Reply):
    """A live console login of a user: when, from where; never its id, which only the cookie holds."""

    id: int = Field(description="the session's row number, to revoke it by (not the cookie's id)")
    created_at: Timestamp
    last_used_at: Timestamp = Field(description="recorded at most once a minute")
    expires_at: Timestamp = Field(description="when it ends unless used again (idle or absolute timeout)")
    address: str | None
    user_agent: str | None


class SessionList(Reply):
    sessions: list[SessionView]


class AuditEventView(Reply):
    """One audit event: who did what, to what, from where, and how it ended."""

    id: int
    ts: Timestamp
    actor: str
    actor_kind: str
    action: str
    target: str
    outcome: AuditOutcome
    detail: dict[str, Any]
    address: str | None
    request_id: str | None


class AuditEvents(Reply):
    events: list[AuditEventView]
