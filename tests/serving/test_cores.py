"""The node's claim on its cores (serving.cores): one lone run at a time, and never beside another run.

Real flock(2) locks on a real file: threads with their own claims stand in for the executors of
one worker, and a second Python process for another worker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from serving.cores import HOLDOFF_S, CoreClaim
from tests.servers import wait_until


class Clock:
    """CLOCK_MONOTONIC's stand-in, shared by the claims of one test: the holdoff passes when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_SH if sys.argv[2] == "shared" else fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def blocked_on(path: Path) -> bool:
    """Whether the kernel lists a claim waiting on `path`'s lock (a `->` line of /proc/locks for its inode)."""
    inode = f":{path.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def holder(path: Path, how: str) -> subprocess.Popen[str]:
    """Start another process that holds a claim on `path` until its stdin closes or it is killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


def test_every_core_is_had_only_while_nothing_else_runs(tmp_path: Path) -> None:
    clock = Clock()
    mine, other = CoreClaim(tmp_path / "cores.lock", clock), CoreClaim(tmp_path / "cores.lock", clock)
    with mine.hold(every=True) as every:
        assert every
    done = threading.Event()
    results: list[bool] = []

    def other_run() -> None:
        with other.hold(every=False) as got:
            results.append(got)
            done.wait(5)

    thread = threading.Thread(target=other_run)
    thread.start()
    try:
        while not results:  # the other thread's shared claim is held from here on
            thread.join(0.01)
        with mine.hold(every=True) as every:
            assert not every  # a run on a share of the cores is going on: no lone run beside it
    finally:
        done.set()
        thread.join(5)
    assert results == [False]
    with mine.hold(every=True) as every:
        assert not every  # idle now, but two runs met a moment ago: requests are not coming one at a time
    clock.now += HOLDOFF_S
    with mine.hold(every=True) as every:
        assert every


def test_a_shared_run_waits_for_a_lone_run_to_end_and_holds_lone_runs_off(tmp_path: Path) -> None:
    clock = Clock()
    lone, shared = CoreClaim(tmp_path / "cores.lock", clock), CoreClaim(tmp_path / "cores.lock", clock)
    order: list[str] = []
    asked = threading.Event()

    def shared_run() -> None:
        asked.set()
        with shared.hold(every=False):
            order.append("shared began")

    with lone.hold(every=True) as every:
        assert every
        thread = threading.Thread(target=shared_run)
        thread.start()
        assert asked.wait(5)
        wait_until(lambda: blocked_on(tmp_path / "cores.lock"), 5, "the shared claim to block on the lock")
        order.append("lone ended")
    thread.join(5)
    assert order == ["lone ended", "shared began"]
    with lone.hold(every=True) as every:
        assert not every  # the shared run had to wait: the next request may come during a lone run too


def test_another_process_holding_the_cores_keeps_a_lone_run_off_them_until_it_dies(tmp_path: Path) -> None:
    clock = Clock()
    claim = CoreClaim(tmp_path / "cores.lock", clock)
    with holder(tmp_path / "cores.lock", "shared") as other:
        try:
            with claim.hold(every=True) as every:
                assert not every
        finally:
            other.send_signal(signal.SIGKILL)  # a worker killed mid-run releases its claim with its descriptors
            other.wait(10)
    clock.now += HOLDOFF_S
    with claim.hold(every=True) as every:
        assert every


def test_a_loads_timing_waits_for_a_pause_then_gives_up(tmp_path: Path) -> None:
    claim = CoreClaim(tmp_path / "cores.lock")
    with claim.every(wait_s=0) as got:
        assert got
    with holder(tmp_path / "cores.lock", "shared"):  # leaving closes its stdin: it exits, and is waited for
        with claim.every(wait_s=0.05) as got:
            assert not got  # the node never paused: the timing runs without every core to itself
    with claim.every(wait_s=0.05) as got:
        assert got


def test_private_claims_are_their_own(tmp_path: Path) -> None:
    first, second = CoreClaim(), CoreClaim()
    with first.hold(every=True) as a, second.hold(every=True) as b:
        assert a and b
    assert not list(tmp_path.iterdir())
