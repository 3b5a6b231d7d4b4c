"""Python's thread names, given to the kernel too, so that `top -H`, `ps -L`, py-spy and perf show them.

CPython 3.11 names its threads for itself only: every executor of every model shows in `top -H` as
its process does. Linux keeps 15 bytes of a thread's name (`/proc/self/task/TID/comm`), and a thread
of the process may name another.
"""

from __future__ import annotations

import threading

KERNEL_NAME_BYTES = 15


def name_in_kernel(thread: threading.Thread, name: str) -> None:
    """Give a started `thread` `name` (its first 15 bytes) in the kernel; nothing where it cannot (not Linux)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/comm", "w") as comm:
            comm.write(name.encode()[:KERNEL_NAME_BYTES].decode(errors="ignore"))
    except OSError:
        pass  # a convenience for people reading top -H, never a reason to fail; a thread already ended, too


def executor_name(name: str, index: int) -> str:
    """The kernel's name of a batcher's executor `index` for version `name` ("textcls-blue/0"): 15 bytes fit."""
    suffix = f"/{index}"
    return name[: KERNEL_NAME_BYTES - len(suffix)] + suffix
