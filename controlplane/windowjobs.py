"""The leader's window jobs: the cluster-wide jobs that read windows of history.

Alert evaluation, drift scores and retention read many rows at each run. The same code runs in a
serving worker (`FLIGHTDECK_JOB_PROCESS=false`) or in the job process (`controlplane.jobprocess`),
which is why these jobs are built from settings and a database alone: no engine, no metrics of the
worker. What they publish (the drift gauge) comes back as data and is set by the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, Rule, load_rules
from alerts.slo import SLO, load_slos, with_burn_rules
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.clock import utcnow
from controlplane.config import Settings
from controlplane.history import drift
from controlplane.history.retention import apply_retention
from controlplane.runbooks.automatic import alert_runner
from controlplane.runbooks.catalog import runbook_directory
from controlplane.runbooks.runner import RunbookRunner

# The job process takes its memory baseline once it has run each of these once.
WINDOW_JOBS = ("history-retention", "alert-evaluator", "drift-score")


def load_alert_rules(settings: Settings) -> tuple[list[Rule], list[SLO]]:
    """Load and validate the alert rules and SLOs, with the SLOs' rules; a broken file stops the start."""
    # The default rules ship inside the `alerts` package (package data), found wherever it is installed.
    folder = Path(settings.alert_rules_dir) if settings.alert_rules_dir else Path(str(files("alerts") / "rules"))
    runbooks = sorted(p.stem for p in runbook_directory().glob("[!_]*.py")) or None
    rules = load_rules(folder, [*METRICS, *LIVE_METRICS], runbooks)
    slos = load_slos(folder, runbooks)  # declared beside the rules, in `slos:` lists
    return with_burn_rules(rules, slos), slos


def build_evaluator(
    settings: Settings,
    sessions: sessionmaker[Session],
    rules: list[Rule],
    runbooks: RunbookRunner,
    engine_ready: Callable[[], bool],
) -> AlertEvaluator:
    """Build the alert evaluator; an automatic runbook run it asks for is queued for the runbook sweeper."""
    return AlertEvaluator(
        sessions,
        rules,
        EvaluatorSettings(
            repeat_interval=timedelta(hours=settings.alert_repeat_h),
            console_url=settings.console_url,
            max_queue_size=settings.max_queue_size,
        ),
        engine_ready=engine_ready,
        run_automatic=alert_runner(runbooks),
    )


class WindowJobs:
    """Run one window job by name; what it returns is plain data (it crosses a pipe from the job process)."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], evaluator: AlertEvaluator) -> None:
        self._settings = settings
        self._sessions = sessions
        self._evaluator = evaluator

    def run(self, job: str) -> Any:
        """Run `job` (one of WINDOW_JOBS) once, here; raise KeyError for any other name."""
        if job == "history-retention":
            with self._sessions() as session:
                return apply_retention(session, utcnow(), self._settings.retention)
        if job == "alert-evaluator":
            return self._evaluator.run()
        if job == "drift-score":
            return drift.current_scores(self._sessions, timedelta(seconds=self._settings.drift_window_s))
        raise KeyError(f"no window job {job!r}; these are: {', '.join(WINDOW_JOBS)}")


def publish(job: str, result: Any) -> None:
    """Publish in this process what a window job found (the drift gauge; the others write only rows)."""
    if job == "drift-score":
        drift.publish([tuple(reading) for reading in result])
