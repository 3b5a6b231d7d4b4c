"""The leader's window jobs in a process of their own (controlplane.jobprocess; issue 29, item 8).

Each test runs a real child (`python -m controlplane.jobprocess`) over the test's SQLite file: the
jobs it runs change the same rows the worker's own run would, what it computes comes back, and it
is replaced when it outgrows its bound, dies or hangs, with no child left behind.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from controlplane import metrics
from controlplane.config import Settings, load_settings
from controlplane.history import drift
from controlplane.jobprocess import JobProcess, JobProcessError, settings_json
from controlplane.models import AlertRecord
from controlplane.windowjobs import WINDOW_JOBS, publish
from tests.controlplane.history.test_drift_api import history

MB = 2**20


def gone(pid: int) -> bool:
    """Return whether no process `pid` exists (a reaped child; not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def starts(why: str) -> float:
    return metrics.JOB_PROCESS_STARTS.labels(why)._value.get()


@pytest.fixture
def settings(app) -> Settings:
    return app.extensions["flightdeck"].settings


@pytest.fixture
def jobs(settings: Settings) -> Iterator[JobProcess]:
    process = JobProcess(settings)
    yield process
    process.close()


def test_the_child_is_given_the_workers_settings_secrets_included(tmp_path: Path) -> None:
    secret = secrets.token_urlsafe(48)
    url = "postgresql://fd:pa55word@db.internal/flightdeck?sslmode=require"
    settings = load_settings(environ={}, overrides={"home": str(tmp_path), "secret_key": secret, "database_url": url})
    line = settings_json(settings)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    copy = Settings(**json.loads(line))
    assert copy == settings
    assert copy.database_url.get_secret_value() == url and copy.secret_key.get_secret_value() == secret


def test_the_evaluator_runs_in_the_child_and_judges_the_workers_readiness(app, jobs: JobProcess) -> None:
    sessions = app.extensions["flightdeck"].sessions

    def engine_alert() -> str | None:
        with sessions() as session:
            row = session.scalars(select(AlertRecord).where(AlertRecord.rule == "engine_not_ready")).first()
            return None if row is None else row.state

    counts = jobs.run("alert-evaluator", engine_ready=False)
    child = jobs.pid
    assert child is not None and child != os.getpid()
    assert counts["changed"] >= 1 and engine_alert() == "pending"  # the rule waits a minute (`for: 1m`)
    jobs.run("alert-evaluator", engine_ready=True)
    assert engine_alert() in (None, "inactive")
    assert jobs.pid == child  # one child serves job after job
    jobs.close()
    assert gone(child)
    with pytest.raises(JobProcessError, match="closed"):
        jobs.run("alert-evaluator", engine_ready=True)


def test_drift_scores_computed_in_the_child_are_the_workers_and_the_worker_publishes_them(
    app, client, jobs: JobProcess
) -> None:
    history(app, datetime.now(UTC))
    readings = jobs.run("drift-score", engine_ready=True)
    here = drift.current_scores(app.extensions["flightdeck"].sessions, timedelta(hours=1))
    # NOTE: each side's window ends at its own `now`: the same rows, scores equal to rounding.
    assert len(here) == 2 and [tuple(r[:4]) for r in readings] == [r[:4] for r in here]
    assert [r[4] for r in readings] == pytest.approx([r[4] for r in here])
    publish("drift-score", readings)
    text = client.get("/metrics").get_data(as_text=True)
    lines = [line for line in text.splitlines() if line.startswith("flightdeck_drift_score{")]
    assert any('kind="predictions"' in line and 'name="logits"' in line for line in lines), lines


def test_a_failing_job_fails_clearly_and_the_child_serves_the_next(jobs: JobProcess) -> None:
    jobs.run("history-retention", engine_ready=True)
    child = jobs.pid
    with pytest.raises(JobProcessError, match="no window job 'no-such-job'"):
        jobs.run("no-such-job", engine_ready=True)
    assert isinstance(jobs.run("history-retention", engine_ready=True), dict)
    assert jobs.pid == child


def test_a_child_past_its_memory_bound_answers_then_retires(app, settings: Settings, monkeypatch) -> None:
    # NOTE: the child's loop, run here over buffers, its RSS readings given: 100 MiB while it warms up (every
    # window job once), then 10 MiB more per job. The bound is 32 MiB, so the fourth job after warm-up retires it.
    from controlplane import jobprocess

    readings = iter([100 * MB] * len(WINDOW_JOBS) + [(100 + 10 * n) * MB for n in range(1, 10)])
    monkeypatch.setattr(jobprocess, "rss_bytes", lambda: next(readings))
    requests = [*WINDOW_JOBS, *["history-retention"] * 6]
    lines = settings_json(settings) + b"".join(
        json.dumps({"job": j, "engine_ready": True}).encode() + b"\n" for j in requests
    )
    answers = io.BytesIO()
    jobprocess.serve(io.BytesIO(lines), answers)
    replies = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert len(replies) == len(WINDOW_JOBS) + 4  # it stopped reading: the worker starts a fresh one for the rest
    assert all(r["ok"] for r in replies) and [bool(r["retiring"]) for r in replies[-2:]] == [False, True]
    assert replies[-1]["rss"] == 140 * MB and replies[-1]["retiring"].startswith("40.0 MiB over its 100 MiB")


def test_a_child_that_died_is_replaced_at_the_next_job(jobs: JobProcess) -> None:
    jobs.run("history-retention", engine_ready=True)
    child = jobs.pid
    assert child is not None
    exited = starts("exited")
    os.kill(child, signal.SIGKILL)
    assert jobs._process is not None and jobs._process.wait(10) == -signal.SIGKILL  # dead before the next job
    assert isinstance(jobs.run("history-retention", engine_ready=True), dict)
    assert jobs.pid not in (None, child) and gone(child)
    assert starts("exited") == exited + 1


def test_a_worker_that_loses_the_lease_stops_its_child_and_starts_another_if_it_leads_again(
    jobs: JobProcess,
) -> None:
    from controlplane.services import _renewed

    jobs.run("history-retention", engine_ready=True)
    child = jobs.pid
    assert child is not None
    _renewed(jobs, True)  # a renewal while leading keeps it
    assert jobs.pid == child
    again = starts("lease")
    _renewed(jobs, False)
    assert jobs.pid is None and gone(child)
    assert metrics.JOB_PROCESS_RSS._value.get() == 0  # no figure left standing for a process that is gone
    assert isinstance(jobs.run("history-retention", engine_ready=True), dict)
    assert jobs.pid not in (None, child)
    assert starts("lease") == again + 1


def test_a_child_that_gives_no_answer_in_time_is_killed(settings: Settings) -> None:
    # NOTE: a fresh child needs about a second to import what it runs: 50 ms is never enough.
    jobs = JobProcess(settings.model_copy(update={"job_process_timeout_s": 0.05}))
    try:
        with pytest.raises(JobProcessError, match="no answer within 0.05 s; the job process was killed"):
            jobs.run("history-retention", engine_ready=True)
        assert jobs.pid is None
    finally:
        jobs.close()


def test_the_child_leaves_no_metrics_files_beside_the_workers(
    jobs: JobProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A gauge file of a process gunicorn never knew would count forever: flightdeck_engine_ready takes the minimum.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    jobs.run("alert-evaluator", engine_ready=True)
    assert jobs.pid is not None
    assert [p.name for p in tmp_path.iterdir() if p.stem.endswith(f"_{jobs.pid}")] == []


def _children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
    return [int(c) for task in tasks for c in (task / "children").read_text().split()]


def _is_job_process(pid: int) -> bool:
    try:
        return b"controlplane.jobprocess" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False


def _exited(pid: int) -> bool:
    """Return whether `pid` has exited: gone, or a zombie (a container's init may never reap an orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_under_gunicorn_the_leaders_job_process_ends_with_its_worker_even_a_killed_one(home: Path) -> None:
    from tests.servers import start_server, wait_until

    server = start_server(home, env={"FLIGHTDECK_ALERT_INTERVAL_S": "0.2", "FLIGHTDECK_LEASE_TTL_S": "2"})
    try:

        def job_process() -> tuple[int, int] | None:
            for worker in _children(server.process.pid):
                found = [c for c in _children(worker) if _is_job_process(c)]
                if found:
                    return worker, found[0]
            return None

        worker, child = wait_until(job_process, 60, "the leader to start its job process")
        wait_until(lambda: "flightdeck_job_process_resident_bytes{" in server.metrics(), 30, "its RSS in /metrics")
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: _exited(child), 30, "the job process to exit with its killed worker")
        _, successor = wait_until(job_process, 60, "the next leader's job process")
        assert successor != child
    finally:
        assert server.stop() == 0
    wait_until(lambda: _exited(successor), 10, "the job process to exit with the server")
