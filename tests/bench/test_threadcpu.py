"""bench.threadcpu: every thread's CPU from /proc, told apart by role, and the per-request report."""

from __future__ import annotations

import os
import threading

from bench.threadcpu import ThreadTimes, report, role, threads_of
from serving.threadnames import executor_name, name_in_kernel


def test_the_threads_of_a_process_are_read_with_their_kernel_names_and_roles() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(10,))
    thread.start()
    try:
        name_in_kernel(thread, executor_name("mlp-blue", 1))
        found = threads_of(os.getpid())
        mine = found[(os.getpid(), thread.native_id)]
        assert mine.name == "mlp-blue/1" and role(mine) == "executor"
        assert role(found[(os.getpid(), os.getpid())]) == "event loop"  # a worker's main thread runs its loop
        assert all(t.cpu_s >= t.sys_s >= 0 and t.switches >= 0 for t in found.values())
    finally:
        stop.set()
        thread.join(5)


def test_the_report_counts_only_the_window_and_leaves_the_master_out() -> None:
    def t(pid: int, tid: int, name: str, cpu: float, switches: int = 0) -> ThreadTimes:
        return ThreadTimes(pid, tid, name, cpu, cpu / 10, switches)

    before = {(1, 1): t(1, 1, "gunicorn", 5.0), (2, 2): t(2, 2, "python", 1.0), (2, 3): t(2, 3, "m-blue/0", 2.0)}
    after = {
        (1, 1): t(1, 1, "gunicorn", 9.0),  # the master: not a worker's thread
        (2, 2): t(2, 2, "python", 1.5, 100),
        (2, 3): t(2, 3, "m-blue/0", 4.0, 50),
        (2, 9): t(2, 9, "python", 3.0),  # started within the window: its CPU before the window is unknown
    }
    lines = report(before, after, wall_s=2.0, requests=1000, master=1)
    assert len(lines) == 4  # a header, two threads, the totals
    assert lines[1].split()[:5] == ["2", "m-blue/0", "executor", "100.0", "2000"]
    assert lines[2].split()[:6] == ["2", "python", "event", "loop", "25.0", "500"]
    assert lines[3] == "totals: executor 100 % of a core, 2000 µs/req, event loop 25 % of a core, 500 µs/req"
