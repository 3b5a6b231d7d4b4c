"""How late the event loop runs what is due: a timer, its lateness handed to `record`.

A loop that is late by more than a few milliseconds is one where something ran on it that should not
(a big body decoded there, a blocking call); the probes it answers are late by as much.

The timer is due every `BUSY_INTERVAL_S` while `busy()` (a client connected, a request in the engine), and
every `IDLE_INTERVAL_S` otherwise: an idle worker's loop woke ten times a second for it and for
uvicorn's tick, 0.3 % of a core for the two (controlplane.worker ticks once a second too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

BUSY_INTERVAL_S = 0.1
IDLE_INTERVAL_S = 1.0


async def watch_loop_lag(
    record: Callable[[float], None],
    busy: Callable[[], bool] = lambda: True,
    busy_interval_s: float = BUSY_INTERVAL_S,
    idle_interval_s: float = IDLE_INTERVAL_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Measure the running loop's lag until cancelled, calling `record(seconds)` after each interval."""
    loop = asyncio.get_running_loop()
    while True:
        interval_s = busy_interval_s if busy() else idle_interval_s
        due = loop.time() + interval_s
        await sleep(interval_s)
        record(max(0.0, loop.time() - due))
