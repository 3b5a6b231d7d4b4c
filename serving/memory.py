"""Process heap statistics from glibc's allocator, and giving free heap memory back to the OS.

Fragmentation here is the allocator's view, in the manner of PyTorch's caching-allocator stats:
bytes the process holds from the OS but has no live allocation in, over all bytes it holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass


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


@dataclass(frozen=True)
class HeapStats:
    """One reading of the process heap, in bytes."""

    rss_bytes: int
    reserved_bytes: int  # held from the OS: arena pages (brk and per-thread arenas) plus mmapped chunks
    in_use_bytes: int  # handed out to live allocations

    @property
    def fragmentation(self) -> float:
        """Return reserved-but-unused bytes over reserved bytes (0 when nothing is reserved)."""
        if self.reserved_bytes <= 0:
            return 0.0
        return max(0.0, (self.reserved_bytes - self.in_use_bytes) / self.reserved_bytes)


def rss_bytes() -> int:
    """Return this process's resident set size."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def heap_stats() -> HeapStats | None:
    """Read glibc's allocator statistics; None where they are not available."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return HeapStats(
        rss_bytes=rss_bytes(),
        reserved_bytes=info.arena + info.hblkhd,
        in_use_bytes=info.uordblks + info.hblkhd,
    )


def trim_heap() -> bool:
    """Give free heap pages back to the OS (malloc_trim); return whether anything was released."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))
