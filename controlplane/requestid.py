"""Request ids: the caller's `X-Request-ID` when it is sensible, else a new one, cheap to make.

Flask-free, so the web layer's request hook (`context.begin_request`) and the event loop's inference
path (`asgi`, which reads the ASGI scope, not Flask's request) share it.
"""

from __future__ import annotations

import itertools
import os

MAX_LENGTH = 128


class _RequestIds:
    """New request ids: 16 random hex digits per process, then a counter (32 hex digits, as uuid4().hex).

    NOTE: uuid4 reads os.urandom on every request (a system call); a random prefix drawn once per
    process (again in a forked child) keeps ids unique across workers and nodes for a counter's cost.
    """

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()  # NOTE: next() on it is atomic under the GIL

    def new(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


_request_ids = _RequestIds()


def request_id_from(given: str | None) -> str:
    """Return `given` (an X-Request-ID header's value) if sensible, else a new id."""
    if given and len(given) <= MAX_LENGTH and given.isprintable():
        return given
    return _request_ids.new()
