"""Roles, ordered viewer < operator < admin, and the Actor a request or command acts as."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

ActorKind = Literal["user", "token", "system", "cli"]


RESERVED = frozenset({"anonymous", "system"})  # names the audit trail uses for actors that are not accounts


class Role(StrEnum):
    """What an account may do. Each role can do everything the ones below it can.

    NOTE: a StrEnum would otherwise compare alphabetically ("admin" < "viewer"); the comparison
    operators below compare by rank, so `actor.role >= Role.OPERATOR` means what it says.
    """

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def __lt__(self, other: object) -> bool:
        return self.rank < Role(other).rank

    def __le__(self, other: object) -> bool:
        return self.rank <= Role(other).rank

    def __gt__(self, other: object) -> bool:
        return self.rank > Role(other).rank

    def __ge__(self, other: object) -> bool:
        return self.rank >= Role(other).rank


_RANKS = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


def parse_role(value: object) -> Role | None:
    """Return the Role named by `value`, or None when it names none."""
    try:
        return Role(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class Actor:
    """Who is acting: a logged-in user, a user's API token, the system itself, or the CLI's OS user."""

    name: str
    role: Role
    kind: ActorKind
    token_id: int | None = None
    user_id: int | None = None


SYSTEM_ACTOR = Actor(name="system", role=Role.ADMIN, kind="system")  # what the control plane does by itself
