"""What the leader's alert evaluation costs as the history grows: `python -m bench.alert_cost`.

An idle server's CPU is mostly its periodic jobs, and the largest of them reads the history: every
`FLIGHTDECK_ALERT_INTERVAL_S` (15 s) the leader evaluates the shipped rules, whose SLO burn windows
reach back 3 days. This fills a real SQLite file with the rows that `--workers` serving processes write
every 10 s, one version per model with an SLO (with `--requests` per row; 0 is an idle server), applies
the retention as the leader would (raw rows older than 6 h rolled up into minutes), and prints, for
each history length, the CPU of the first evaluation after a start (nothing kept yet) and of the ones
after it, and what that is as a share of one core at the default interval.

    python -m bench.alert_cost --hours 0,1,6,24,72
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from alerts.slo import SLI
from controlplane.clock import utcnow
from controlplane.config import load_settings
from controlplane.db import make_engine, session_factory
from controlplane.history.retention import apply_retention
from controlplane.migrate import upgrade
from controlplane.models import DeviceSample, SlotSample
from controlplane.runbooks.runner import build_runner
from controlplane.windowjobs import build_evaluator, load_alert_rules

STEP_S = 10  # the sampler's default interval (FLIGHTDECK_HISTORY_INTERVAL_S)


def _served(requests: int) -> dict:
    """The JSON columns of a row that served `requests`, shaped as a classifier's rows are: a few latency and
    compute buckets, ten predicted labels, one sampled input's summary over twenty bins."""
    quarter, tenth, twentieth = requests // 4, requests // 10, requests // 20
    return {
        "latency_hist": {str(b): quarter for b in (38, 39, 40, 41)},
        "batch_sizes": {"1": requests},
        "compute_hist": {"1": {str(b): quarter for b in (30, 31, 32, 33)}},
        "label_counts": {"logits": {str(label): tenth for label in range(10)}},
        "input_summaries": {
            "input": {"n": requests, "sum": 0.5 * requests, "sumsq": 0.3 * requests,
                      "bins": {str(b): twentieth for b in range(20)}},
        },
    }  # fmt: skip


def seed(sessions, start_h: float, end_h: float, now, workers: int, versions: list[tuple[str, str]], requests: int):
    """Write the rows of (now - end_h, now - start_h] as `workers` processes' samplers would."""
    with sessions() as session, session.begin():
        for step in range(round(start_h * 3600 / STEP_S), round(end_h * 3600 / STEP_S)):
            ts = now - timedelta(seconds=STEP_S * step)
            for worker in range(workers):
                process = f"bench:{worker}"
                for model, version in versions:
                    session.add(
                        SlotSample(
                            ts=ts,
                            resolution_s=0,
                            interval_s=STEP_S,
                            process=process,
                            model=model,
                            version=version,
                            slot="blue",
                            successes=requests,
                            latency_sum_s=0.002 * requests,
                            batches=requests,
                            **(_served(requests) if requests else {}),
                        )  # fmt: skip
                    )
                session.add(
                    DeviceSample(
                        ts=ts,
                        resolution_s=0,
                        interval_s=STEP_S,
                        process=process,
                        device="cpu",
                        memory_used_bytes=300 << 20,
                        reserved_bytes=200 << 20,
                        in_use_bytes=150 << 20,
                        fragmentation=0.25,
                    )  # fmt: skip
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", default="0,1,6,24,72", help="history lengths to measure, growing")
    parser.add_argument("--workers", type=int, default=2, help="serving processes writing rows (make run: 2)")
    parser.add_argument("--requests", type=int, default=0, help="requests per row (0: an idle server)")
    parser.add_argument("--evaluations", type=int, default=8, help="evaluations timed per history length")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="alert-cost-") as tmp:
        settings = load_settings({"FLIGHTDECK_HOME": str(Path(tmp) / "home")})
        settings.home.mkdir(parents=True)
        upgrade(settings.sqlalchemy_url)
        db = make_engine(settings.sqlalchemy_url)
        sessions = session_factory(db)
        rules, slos = load_alert_rules(settings)
        versions = sorted({(slo.model, "1") for slo in slos if slo.sli is SLI.AVAILABILITY})
        now, seeded = utcnow(), 0.0
        print(
            f"alert evaluation of the {len(rules)} shipped rules; rows of {args.workers} processes x "
            f"{len(versions)} versions every {STEP_S} s, {args.requests} requests each"
        )
        for hours in [float(h) for h in args.hours.split(",")]:
            seed(sessions, seeded, hours, now, args.workers, versions, args.requests)
            seeded = hours
            with sessions() as session:
                apply_retention(session, now, settings.retention)
            evaluator = build_evaluator(settings, sessions, rules, build_runner(settings, sessions), lambda: True)
            costs = []
            for _ in range(args.evaluations + 1):
                started = time.thread_time()
                evaluator.run()
                costs.append(time.thread_time() - started)
            first, steady = costs[0], statistics.median(costs[1:])
            share = 100 * steady / settings.alert_interval_s
            print(
                f"  {hours:5g} h of history: first evaluation {first * 1e3:7.1f} ms, then {steady * 1e3:6.1f} ms "
                f"(median of {args.evaluations}) = {share:.2f} % of a core every {settings.alert_interval_s:g} s"
            )
        db.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
