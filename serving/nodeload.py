"""How much of the node's cores other processes used while this one timed something (Linux's /proc/stat).

A load times its lone-request session (serving.engine) once, and every worker of the node keeps the
decision for its lifetime. That timing compares a run on every core with a run on one, so another
process busy on the cores meanwhile makes every core look no faster. Seen here: a server started
right after another stopped timed textcls at 5.18 ms on 2 threads against 5.70 on 1 (3.0-3.4 on a
quiet node), kept no lone session, and ran every lone request on one core until it was restarted.
`OthersBusy` measures that disturbance, so the load can time again once it has passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

STAT = Path("/proc/stat")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Shorter than this, the counters (ticks of 10 ms) say nothing: no figure.
MIN_WINDOW_S = 0.1


def busy_cpu_s(stat: Path = STAT) -> float | None:
    """Return the node's busy CPU seconds since boot (every state but idle and iowait; steal counts); None: unknown.

    Also what the benchmarks read (bench.measure.cpu_probe).
    """
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already counted in user and nice]
    ticks = [int(value) for value in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


def _own_cpu_s() -> float:
    """Return this process's CPU seconds, every thread's (os.times; children not included)."""
    times = os.times()
    return times.user + times.system


class OthersBusy:
    """A block's measure of other processes on the node: `cores` is the cores they kept busy on average.

    None where it cannot be known (no /proc/stat, or a block shorter than MIN_WINDOW_S). Steal time (a
    hypervisor giving this VM's cores to another) counts as another process: it slows a timing alike.
    """

    def __init__(
        self, stat: Path = STAT, own_cpu: Callable[[], float] = _own_cpu_s, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stat, self._own_cpu, self._clock = stat, own_cpu, clock
        self.cores: float | None = None

    def __enter__(self) -> OthersBusy:
        self._busy, self._own, self._started = busy_cpu_s(self._stat), self._own_cpu(), self._clock()
        return self

    def __exit__(self, *_: object) -> None:
        wall = self._clock() - self._started
        busy = busy_cpu_s(self._stat)
        if busy is None or self._busy is None or wall < MIN_WINDOW_S:
            return
        others = (busy - self._busy) - (self._own_cpu() - self._own)
        self.cores = max(0.0, others / wall)
