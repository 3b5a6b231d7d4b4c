"""How late the event loop runs what is due: a timer every `INTERVAL_S`, its lateness handed to `record`.

A loop that is late by more than a few milliseconds is one where something ran on it that should not
(a big body decoded there, a blocking call); the probes it answers are late by as much.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

INTERVAL_S = 0.1


async def watch_loop_lag(record: Callable[[float], None], interval_s: float = INTERVAL_S) -> None:
    """Measure the running loop's lag every `interval_s` until cancelled, calling `record(seconds)` each time."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        record(max(0.0, loop.time() - due))
