"""Process memory: how much of what the process holds in RAM is live data, and giving the rest back.

Definitions (bytes; `heap_stats()` reads them, every figure from the kernel or an allocator):

- reserved: resident anonymous memory (`/proc/self/statm` resident minus shared, the kernel's RssAnon):
  what the process holds in RAM that is no file's page cache: glibc's heap and mmapped chunks,
  ONNX Runtime's arenas (they live in glibc chunks), Python's object arenas and thread stacks.
- heap_live: bytes glibc has handed out and not had back (mallinfo2 `uordblks + hblkhd`).
- arena_idle: bytes ONNX Runtime's CPU arenas hold that no tensor uses. ONNX Runtime frees every
  intermediate tensor at the end of a run but keeps the arena regions, and glibc counts those as
  live; ONNX Runtime gives Python no arena statistics, so each session's `ArenaLedger` counts
  the growth of `heap_live` while runs that can grow the arena are in flight (the first two runs
  of each input shape since the arena was last shrunk, and runs overlapping another run of the
  session) and forgets it when the arena is shrunk or the session goes.
- in_use: heap_live minus arena_idle: bytes holding live data.
- fragmentation: (reserved - in_use) / reserved: the share of resident memory that holds no live
  data (free heap pages glibc has not returned, idle arena regions), in the manner of the PyTorch
  caching allocator's reserved-versus-allocated figures. Python's own object arenas and thread
  stacks are resident but not glibc allocations, so they count as not live: a floor of some
  tens of MiB in a Python process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

T = TypeVar("T")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc, or glibc older than 2.33
        return None


_LIBC = _libc()
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class HeapStats:
    """One reading of the process's memory, in bytes (see the module docstring for the definitions)."""

    rss_bytes: int  # resident set: anonymous plus file-backed pages
    reserved_bytes: int  # resident anonymous memory
    in_use_bytes: int  # heap_live_bytes minus arena_idle_bytes
    heap_live_bytes: int = 0  # glibc: allocated and not freed (uordblks + hblkhd)
    heap_free_bytes: int = 0  # glibc: free chunks, resident or already given back with MADV_DONTNEED
    arena_idle_bytes: int = 0  # ONNX Runtime CPU arenas: held but holding no tensor

    @property
    def fragmentation(self) -> float:
        """Return resident bytes holding no live data over resident bytes (0 when nothing is resident)."""
        if self.reserved_bytes <= 0:
            return 0.0
        return min(1.0, max(0.0, (self.reserved_bytes - self.in_use_bytes) / self.reserved_bytes))

    def as_dict(self) -> dict[str, float | int]:
        """Return the fields and the fragmentation figure, for reports."""
        return {**asdict(self), "fragmentation": round(self.fragmentation, 4)}


def _statm() -> tuple[int, int]:
    """Return (resident, resident anonymous) bytes of this process."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    resident, shared = int(fields[1]), int(fields[2])  # shared: file-backed and shmem pages
    return resident * _PAGE, max(0, resident - shared) * _PAGE


def rss_bytes() -> int:
    """Return this process's resident set size."""
    return _statm()[0]


def available_bytes() -> int | None:
    """Return the memory the kernel says is available for new work (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def heap_live_bytes() -> int:
    """Return the bytes glibc has handed out and not had back (0 without glibc)."""
    if _LIBC is None:
        return 0
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


def heap_stats() -> HeapStats | None:
    """Read the kernel's and glibc's figures; None where glibc's statistics are not available."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    rss, anon = _statm()
    live = info.uordblks + info.hblkhd
    idle = min(arena_idle_bytes(), live)
    return HeapStats(
        rss_bytes=rss,
        reserved_bytes=anon,
        in_use_bytes=live - idle,
        heap_live_bytes=live,
        heap_free_bytes=info.fordblks,
        arena_idle_bytes=idle,
    )


def trim_heap() -> bool:
    """Give free heap pages back to the OS (malloc_trim); return whether anything was released."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))


# -- ONNX Runtime arena bookkeeping ------------------------------------------------------------

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


def shape_key(inputs: dict[str, object]) -> ShapeKey:
    """Return the input shapes of a run, by input name."""
    # NOTE: a numpy shape is already a tuple of ints; this runs once per model run, so nothing more is built.
    return tuple(sorted((name, tuple(getattr(value, "shape", ()))) for name, value in inputs.items()))


class _ArenaMeter:
    """Glibc's live-byte growth while watched runs are in flight, shared out to their sessions' ledgers.

    The first watched run to start opens a window (glibc's live bytes then), the last to end closes
    it and shares the change among the ledgers whose runs it watched; a window open longer than
    `ROLL_S` is also read, and reopened, at the end of a watched run, so a server that is never idle
    still updates. Arena regions stay after the run that allocated them, so the change is the
    arenas' growth, plus whatever else the process allocated or freed meanwhile (small next to arena
    regions, and it evens out).
    """

    ROLL_S = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watching = 0
        self._baseline = 0
        self._since = 0.0
        self._ledgers: set[ArenaLedger] = set()  # ledgers with a watched run in the open window

    def begin(self, ledger: ArenaLedger) -> None:
        with self._lock:
            if self._watching == 0:
                self._baseline, self._since = heap_live_bytes(), time.monotonic()
            self._watching += 1
            self._ledgers.add(ledger)

    def end(self) -> None:
        with self._lock:
            self._watching -= 1
            now = time.monotonic()
            if self._watching and now - self._since < self.ROLL_S:
                return
            live = heap_live_bytes()
            share = (live - self._baseline) // max(1, len(self._ledgers))
            for ledger in self._ledgers:
                ledger.add_idle(share)
            self._baseline, self._since = live, now
            # Ledgers with watched runs still in flight stay for the next reading; the others leave.
            self._ledgers = {ledger for ledger in self._ledgers if ledger.watching}

    def release(self, ledger: ArenaLedger, run: Callable[[], T]) -> tuple[T, int]:
        """Call `run`, which shrinks `ledger`'s arena, with windows held; return its result and the change.

        The ledger starts again from nothing idle, and an open window does not see what was given back.
        """
        with self._lock:
            before = heap_live_bytes()
            result = run()
            change = heap_live_bytes() - before
            self._baseline += change
            ledger.forget()
        return result, change


_METER = _ArenaMeter()
_LEDGERS: weakref.WeakSet[ArenaLedger] = weakref.WeakSet()
_LEDGERS_LOCK = threading.Lock()


class ArenaLedger:
    """One session's ONNX Runtime CPU arena: which runs can grow it, and its estimated idle bytes.

    A run can grow the arena when its shapes have not run twice since the arena was last shrunk (the
    first run of a shape allocates tensor by tensor, the second allocates the memory pattern ONNX
    Runtime then caches, as one block), or when another run of the session is in flight (both need
    room at once). Those runs are watched (see `_ArenaMeter`); the others find the arena all free
    and fit, and run unwatched, at no cost. The ledger leaves the process's figure with its session.
    """

    RUNS_TO_SETTLE = 2
    MAX_SHAPES = 4096

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and _LIBC is not None  # False: no CPU arena to watch, or no glibc to ask
        self._lock = threading.Lock()
        self._runs: dict[ShapeKey, int] = {}  # runs per shape since the last shrink, up to RUNS_TO_SETTLE
        self._in_flight = 0
        self._watched_in_flight = 0
        self._idle = 0
        self.watched_runs = 0
        with _LEDGERS_LOCK:
            _LEDGERS.add(self)

    @property
    def idle_bytes(self) -> int:
        return self._idle

    @property
    def watching(self) -> bool:
        return self._watched_in_flight > 0

    def settled(self, key: ShapeKey) -> bool:
        """Return whether runs of these shapes, alone, fit in what the arena already holds."""
        return self._runs.get(key, 0) >= self.RUNS_TO_SETTLE

    def run(self, key: ShapeKey, run: Callable[[], T]) -> T:
        """Call `run`, watched when it can grow the arena."""
        with self._lock:
            watched = self.enabled and (self._in_flight > 0 or not self.settled(key))
            self._in_flight += 1
            if watched:
                self._watched_in_flight += 1
                self.watched_runs += 1
        if watched:
            _METER.begin(self)
        try:
            return run()
        finally:
            with self._lock:
                self._in_flight -= 1
                if watched:
                    self._watched_in_flight -= 1
                runs = self._runs.get(key, 0)
                if runs < self.RUNS_TO_SETTLE:
                    if not runs and len(self._runs) >= self.MAX_SHAPES:
                        self._runs.clear()  # forgetting shapes only costs watching them again
                    self._runs[key] = runs + 1
            if watched:
                _METER.end()

    def add_idle(self, change: int) -> None:
        with self._lock:
            self._idle = max(0, self._idle + change)

    def shrink(self, run: Callable[[], T]) -> tuple[T, int]:
        """Call `run`, a run that shrinks this session's CPU arena with none of its other runs in flight.

        Return its result and the change in glibc's live bytes (negative: given back).
        """
        return _METER.release(self, run)

    def forget(self) -> None:
        """Start again from an arena shrunk as far as it goes: nothing idle, no shape settled."""
        with self._lock:
            self._runs.clear()
            self._idle = 0


def arena_idle_bytes() -> int:
    """Return the estimated idle bytes of the CPU arenas of every session alive in the process."""
    with _LEDGERS_LOCK:
        ledgers = list(_LEDGERS)
    return sum(ledger.idle_bytes for ledger in ledgers)
