"""One node of the fail-over test (`python -m tests.controlplane.failover_node URL TTL_S`).

A `LeaderScheduler` whose cluster job delivers the alert outbox, as a serving node's does, and
prints one line per run (`run <monotonic time> <pid>`) so the test can see who led when. It runs
until its stdin closes (or it is killed).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from controlplane.alerting.outbox import deliver_due
from controlplane.db import make_engine, session_factory
from controlplane.scheduler import LeaderScheduler
from tests.alerts.notifiers.recorder import deliver_local

JOB_INTERVAL_S = 0.1


def main(url: str, ttl_s: float) -> None:
    """Run one node until stdin closes."""
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: maximum number of running instances"
    sessions = session_factory(make_engine(url))
    scheduler = LeaderScheduler(sessions, ttl_s, process=f"node:{os.getpid()}")

    def outbox() -> None:
        # NOTE: CLOCK_MONOTONIC is one clock for every process on the host, so lines compare across nodes.
        print(f"run {time.monotonic():.4f} {os.getpid()}", flush=True)
        deliver_due(sessions, send=deliver_local, backoff_s=0.5)

    scheduler.add_cluster_job(outbox, JOB_INTERVAL_S, "alert-outbox")
    scheduler.start()
    print(f"started {os.getpid()}", flush=True)
    sys.stdin.read()
    scheduler.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
