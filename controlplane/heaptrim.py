"""Give the C heap's free memory back to the operating system (glibc's `malloc_trim`), where there is one.

Why (issue 29, item 8): glibc keeps memory that was freed, in the main heap and in each thread's
arena, for the next allocation; only a free block at a heap's very top is returned by itself. Under
steady load the lease holder's RSS grew while the bytes glibc counted in use stayed flat
(`malloc_stats`: +8.7 MB of heap, -0.2 MB in use over 5 minutes). `malloc_trim(0)` gives back every
free page: called once on that process it returned 13 MB. It lowers the level, not the slope: with this
job every minute the leader still grew ~63 MB an hour; fewer arenas (`MALLOC_ARENA_MAX`, set by
`flightdeck serve`) slowed it most. Both are mitigations. Figures: SECURITY.md, "Memory over a long run".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # NOTE: glibc only; musl (Alpine) and macOS have none
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def available() -> bool:
    """Return whether this C library can trim its heap."""
    return _TRIM is not None


def trim() -> bool:
    """Return free heap pages to the OS; return whether any were (False where the C library cannot)."""
    return bool(_TRIM(0)) if _TRIM is not None else False
