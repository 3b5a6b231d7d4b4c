"""Other processes' use of the node's cores during a block, from the kernel's own counters (serving.nodeload)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from serving.nodeload import CLK_TCK, OthersBusy

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the kernel's counters are Linux's")


def cpu_s(pid: int) -> float:
    """Return a process's CPU seconds so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@contextmanager
def burner() -> Iterator[subprocess.Popen[bytes]]:
    """Another process that keeps one core busy until the block ends."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def until_it_burned(process: subprocess.Popen[bytes], seconds: float) -> None:
    """Return once `process` has used `seconds` more of CPU than when called (a window it surely fell in)."""
    start = cpu_s(process.pid)
    while cpu_s(process.pid) - start < seconds:
        assert process.poll() is None, "the burner exited"
        time.sleep(0.01)  # NOTE: polling the burner's own counter, the condition waited for


def test_another_process_busy_during_the_block_counts() -> None:
    with burner() as process:
        until_it_burned(process, 0.05)  # it is running
        with OthersBusy() as others:
            until_it_burned(process, 0.3)
    # One core's worth, less what the machine's own scheduling took from it (two cores here).
    assert others.cores is not None and others.cores >= 0.6, others.cores


def _stat_line(busy: int, idle: int) -> str:
    """A /proc/stat first line: `busy` ticks spread over user and system, `idle` idle, 7 iowait (not busy)."""
    return f"cpu  {busy - busy // 4} 0 {busy // 4} {idle} 7 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def test_this_process_own_work_does_not_count(tmp_path: Path) -> None:
    # NOTE: the counters are given: on a shared machine (the test suite's other workers) real ones vary.
    stat, own, now = tmp_path / "stat", [10.0], [100.0]
    stat.write_text(_stat_line(busy=1000, idle=5000))
    with OthersBusy(stat, own_cpu=lambda: own[0], clock=lambda: now[0]) as others:
        # One second: the node was busy 2 s of CPU (two cores), 1.5 of them this process's own.
        stat.write_text(_stat_line(busy=1000 + 2 * CLK_TCK, idle=5000))
        own[0] += 1.5
        now[0] += 1.0
    assert others.cores == pytest.approx(0.5)


def test_the_figure_never_goes_below_zero(tmp_path: Path) -> None:
    # This process's own time and the node's ticks are read a moment apart: its own can come out larger.
    stat, own, now = tmp_path / "stat", [0.0], [0.0]
    stat.write_text(_stat_line(busy=1000, idle=0))
    with OthersBusy(stat, own_cpu=lambda: own[0], clock=lambda: now[0]) as others:
        stat.write_text(_stat_line(busy=1000 + CLK_TCK, idle=0))
        own[0] += 1.02
        now[0] += 0.5
    assert others.cores == 0.0


def test_no_figure_without_the_counters_or_for_a_block_too_short(tmp_path: Path) -> None:
    def one_second_later() -> Callable[[], float]:
        times = iter([0.0, 1.0])
        return lambda: next(times)

    with OthersBusy(tmp_path / "absent", clock=one_second_later()) as missing:
        pass
    assert missing.cores is None
    with OthersBusy() as short:  # the real counters, over a block far shorter than MIN_WINDOW_S
        pass
    assert short.cores is None
    not_stat = tmp_path / "stat"
    not_stat.write_text("intr 1 2 3\n")
    with OthersBusy(not_stat, clock=one_second_later()) as unreadable:
        pass
    assert unreadable.cores is None
