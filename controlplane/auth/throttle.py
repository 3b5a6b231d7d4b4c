"""Slowing password guessing: per name and client address, in this process's memory.

After `max_failures` failed logins for one name from one address, further attempts are refused
(429, without checking the password) for `lockout_s`; each further failure doubles that period,
up to 64 times. A success, or a quiet spell of `forget_after_s`, forgets the failures.

Limits, on purpose: the counts live in one process (with several gunicorn workers an attacker
gets `max_failures` tries per worker before the first lockout) and vanish on restart; a guesser
spreading over many addresses is slowed only by scrypt's cost. The table is capped at
`max_entries`; past it the stalest entries go first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_FACTOR = 64


@dataclass
class _Failures:
    count: int
    last_at: float
    locked_until: float = 0.0


def throttle_key(name: str, address: str | None) -> str:
    """Return the key failures are counted under: the name (case-folded) and the client address."""
    return f"{name.casefold()}\x00{address or '-'}"


class LoginThrottle:
    """Counts failed logins per key and says how long the next attempt must wait.

    Example:
        throttle = LoginThrottle(max_failures=5, lockout_s=30)   # clock= for tests
        if throttle.retry_after(key): refuse
        ... throttle.failed(key) or throttle.succeeded(key)
    """

    def __init__(
        self,
        max_failures: int,
        lockout_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 10_000,
    ) -> None:
        self.max_failures = max_failures
        self.lockout_s = lockout_s
        self.forget_after_s = max(lockout_s * MAX_FACTOR, 900.0)
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, _Failures] = {}
        self._lock = threading.Lock()

    def retry_after(self, key: str) -> float:
        """Return the seconds until `key` may try again (0: now)."""
        with self._lock:
            entry = self._entries.get(key)
            return 0.0 if entry is None else max(0.0, entry.locked_until - self._clock())

    def failed(self, key: str) -> float:
        """Count a failure for `key`; return the refusal period it starts (0 while under the limit)."""
        with self._lock:
            now = self._clock()
            entry = self._entries.get(key)
            if entry is None or now - entry.last_at > self.forget_after_s:
                entry = _Failures(count=0, last_at=now)
            entry.count += 1
            entry.last_at = now
            if entry.count >= self.max_failures:
                factor = min(2 ** (entry.count - self.max_failures), MAX_FACTOR)
                entry.locked_until = now + self.lockout_s * factor
            self._entries[key] = entry
            self._prune(now)
            return max(0.0, entry.locked_until - now)

    def failures(self, key: str) -> int:
        """Return the failures counted for `key`."""
        with self._lock:
            entry = self._entries.get(key)
            return 0 if entry is None else entry.count

    def succeeded(self, key: str) -> None:
        """Forget `key`'s failures."""
        with self._lock:
            self._entries.pop(key, None)

    def _prune(self, now: float) -> None:
        if len(self._entries) <= self.max_entries:
            return
        stale = [k for k, e in self._entries.items() if now - e.last_at > self.forget_after_s]
        for key in stale:
            del self._entries[key]
        if len(self._entries) > self.max_entries:
            by_age = sorted(self._entries, key=lambda k: self._entries[k].last_at)
            for key in by_age[: len(self._entries) - self.max_entries]:
                del self._entries[key]
