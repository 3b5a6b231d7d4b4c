"""Slowing password guessing: failed logins per name and client address, counted in the database.

After `max_failures` failed logins for one name from one address, further attempts are refused
(429, without checking the password) for `lockout_s`; each further failure doubles that period,
up to 64 times. A success, or a quiet spell of `forget_after_s`, forgets the failures.

The counts live in the `login_failures` table, so every gunicorn worker and every node sharing the
database enforces one limit, and a restart forgets nothing. Rows are keyed by a SHA-256 of the
name and address (a password typed into the name field is never stored) and deleted once stale.
A guesser spreading over many addresses is slowed only by scrypt's cost.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from flask import current_app
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.models import LoginFailure

MAX_FACTOR = 64
THROTTLE = "flightdeck.login_throttle"  # app.extensions key; tests put one with a fake clock there


def throttle_key(name: str, address: str | None) -> str:
    """Return the key failures are counted under: the name (case-folded) and the client address."""
    return f"{name.casefold()}\x00{address or '-'}"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class LoginThrottle:
    """Counts failed logins per key and says how long the next attempt must wait.

    Each call is its own short transaction, apart from the request's. Example:
        throttle = LoginThrottle(sessions, max_failures=5, lockout_s=30)   # clock= for tests
        if throttle.retry_after(key): refuse
        ... throttle.failed(key) or throttle.succeeded(key)
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        max_failures: int,
        lockout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_failures = max_failures
        self.lockout_s = lockout_s
        self.forget_after_s = max(lockout_s * MAX_FACTOR, 900.0)
        self._sessions = sessions
        self._clock = clock

    def retry_after(self, key: str) -> float:
        """Return the seconds until `key` may try again (0: now)."""
        with self._sessions() as session:
            row = session.get(LoginFailure, _digest(key))
            return 0.0 if row is None else max(0.0, row.locked_until - self._clock())

    def failed(self, key: str) -> float:
        """Count a failure for `key`; return the refusal period it starts (0 while under the limit)."""
        try:
            return self._count_failure(key)
        except IntegrityError:  # NOTE: another process inserted the key's first row at the same moment
            return self._count_failure(key)

    def failures(self, key: str) -> int:
        """Return the failures counted for `key`."""
        with self._sessions() as session:
            row = session.get(LoginFailure, _digest(key))
            return 0 if row is None else row.failures

    def succeeded(self, key: str) -> None:
        """Forget `key`'s failures."""
        with self._sessions() as session, session.begin():
            session.execute(delete(LoginFailure).where(LoginFailure.key_hash == _digest(key)))

    def _count_failure(self, key: str) -> float:
        now = self._clock()
        with self._sessions() as session, session.begin():
            row = session.get(LoginFailure, _digest(key), with_for_update=True)
            if row is None or now - row.last_at > self.forget_after_s:
                if row is None:
                    row = LoginFailure(key_hash=_digest(key))
                    session.add(row)
                row.failures, row.locked_until = 0, 0.0
            row.failures += 1
            row.last_at = now
            if row.failures >= self.max_failures:
                factor = min(2 ** (row.failures - self.max_failures), MAX_FACTOR)
                row.locked_until = now + self.lockout_s * factor
            session.execute(delete(LoginFailure).where(LoginFailure.last_at < now - self.forget_after_s))
            return max(0.0, row.locked_until - now)


def current_throttle() -> LoginThrottle:
    """Return the login throttle of the application handling the current request (API and console alike)."""
    return current_app.extensions[THROTTLE]
