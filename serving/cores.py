"""Every core for one run at a time on a node: the claim a lone-request session takes (issue 26).

A version's lone-request session (serving.engine) has an intra-op thread per core and spins them
within a run. Two such runs at once, from two workers of one server, would put twice as many
spinning threads as cores on the machine: on 2 cores that cost 0.67x at concurrency 2. So a run
takes a claim on a lock file first, shared for a run on the version's own share of the cores,
exclusive for a lone run. A lone run gets every core only when nothing else on the node is running
(the exclusive claim is tried, never waited for: the run falls back to the shared session), and a
shared run that starts during a lone run waits for it (a few milliseconds) rather than slow it.

flock(2) locks belong to an open file description, so each thread opens the file itself: the
threads of one process then exclude each other as processes do. A process that dies, even by
SIGKILL, releases its claims with its descriptors.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# How long a load's timing of its lone session waits for the node's other runs to pause (see `every`).
TIMING_WAIT_S = 2.0


class _Descriptor:
    """A file descriptor closed when its owner lets it go: a thread's ends with the thread's locals."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class CoreClaim:
    """A node-wide claim on the cores: `hold(every=True)` gets them all when nothing else runs."""

    def __init__(self, path: Path | None = None) -> None:
        self._anchor: _Descriptor | None = None
        if path is None:
            # NOTE: without a path, a private file, unlinked at once and reopened through /proc by each thread:
            # the threads of this process coordinate, nothing else does, and nothing is left on the disk.
            fd, name = tempfile.mkstemp(prefix="flightdeck-cores-")
            os.unlink(name)
            self._anchor = _Descriptor(fd)  # closed when the claim is collected
            path = Path(f"/proc/{os.getpid()}/fd/{fd}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._local = threading.local()

    def _fd(self) -> int:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _Descriptor(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        return handle.fd

    @contextmanager
    def hold(self, every: bool) -> Iterator[bool]:
        """Claim the cores for one run; yield True where it got every one (`every` asked, nothing else running)."""
        fd = self._fd()
        got = False
        if every:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
            except BlockingIOError:
                pass
        if not got:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits out a lone run in progress
        try:
            yield got
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    @contextmanager
    def every(self, wait_s: float = TIMING_WAIT_S) -> Iterator[bool]:
        """Hold every core while a load times its lone session; yield False if the node stayed busy for `wait_s`.

        NOTE: flock has no writer preference, so a node serving without a pause could keep an exclusive
        claim waiting for ever: it is tried every few milliseconds until `wait_s`, then the timing runs anyway.
        """
        fd = self._fd()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.005)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
