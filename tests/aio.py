"""Run a coroutine to completion from a synchronous test, whatever loop the test's thread holds.

NOTE: the browser tests' session-scoped Playwright (tests/e2e/browser.py) keeps an event loop running
in pytest's main thread for the rest of the session, so a later `asyncio.run` there fails; a fresh
loop in a thread of its own works wherever the test runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run `make()` on a new event loop in its own thread and return its result (or raise its error)."""

    async def main() -> T:
        return await make()

    with ThreadPoolExecutor(1, thread_name_prefix="test-loop") as pool:
        return pool.submit(asyncio.run, main()).result()
