"""Every core for one run at a time on a node: the claim a lone-request session takes (issue 26).

A version's lone-request session (serving.engine) has an intra-op thread per core and spins them
within a run. Two such runs at once, from two workers of one server, would put twice as many
spinning threads as cores on the machine: on 2 cores that cost 0.67x at concurrency 2. So every
run on the CPU takes a claim on a lock file first: shared for a run on its version's share of the
cores (whether or not that version has a lone session), exclusive for a lone run. A lone run gets
every core only when nothing else on the node is running (the exclusive claim is tried, never
waited for: the run falls back to the shared session), and a shared run that starts during a lone
run waits for it (a few milliseconds) rather than slow it.

A lone run is also worth it only while requests come one at a time: it spends more CPU per request
than a run on one core (two threads' hand-offs), which pays only where the other cores would idle.
Measured on 2 cores (textcls seq 32 and 128), lone runs gained 1.36-1.40x at concurrency 1 and cost
0.90x at concurrency 2, where a second request often arrived during a lone run and waited. So any
sign of concurrency on the node (a lone claim refused, a shared claim that had to wait) is written
into the lock file itself (a time, 8 bytes, mapped in memory), and no lone run is tried for
HOLDOFF_S after it.

flock(2) locks belong to an open file description, so each thread opens the file itself: the
threads of one process then exclude each other as processes do. A process that dies, even by
SIGKILL, releases its claims with its descriptors.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# How long a load's timing of its lone session waits for the node's other runs to pause (see `every`).
TIMING_WAIT_S = 2.0
# No lone run for this long after two runs met on the node (CLOCK_MONOTONIC: one clock for every process).
HOLDOFF_S = 1.0
_STAMP = struct.Struct("<d")


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

    def __init__(self, path: Path | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._stamp: mmap.mmap | None = None  # the lock file's 8 bytes: when runs last met on the node
        self._stamp_lock = threading.Lock()
        self._anchor: _Descriptor | None = None
        if path is None:
            # NOTE: without a path, a private file, unlinked at once and reopened through /proc by each thread:
            # the threads of this process coordinate, nothing else does, and nothing is left on the disk.
            fd, name = tempfile.mkstemp(prefix="flightdeck-cores-")
            os.unlink(name)
            self._anchor = _Descriptor(fd)  # closed when the claim is collected
            path = Path(f"/proc/self/fd/{fd}")  # NOTE: self, read at each open: a forked child opens its own
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._local = threading.local()

    def _fd(self) -> int:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _Descriptor(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        return handle.fd

    def _met_at(self) -> mmap.mmap:
        if self._stamp is not None:
            return self._stamp
        with self._stamp_lock:
            if self._stamp is None:
                fd = self._fd()  # the mapping keeps the file; the thread's descriptor stays the thread's
                if os.fstat(fd).st_size < _STAMP.size:
                    os.ftruncate(fd, _STAMP.size)  # NOTE: every process sizes it alike: zeros, "long ago"
                self._stamp = mmap.mmap(fd, _STAMP.size)
            return self._stamp

    def _calm(self) -> bool:
        """Whether no two runs have met on the node for HOLDOFF_S."""
        return self._clock() - _STAMP.unpack_from(self._met_at(), 0)[0] >= HOLDOFF_S

    def _met(self) -> None:
        _STAMP.pack_into(self._met_at(), 0, self._clock())

    @contextmanager
    def hold(self, every: bool) -> Iterator[bool]:
        """Claim the cores for one run; yield True where it got every one (`every` asked, the node calm and idle)."""
        fd = self._fd()
        got = False
        if every and self._calm():
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
            except BlockingIOError:
                self._met()
        if not got:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                self._met()
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
