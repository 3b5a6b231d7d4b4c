"""What the terminal and HOME/logs show: the real server's lines, in text and JSON, and APScheduler kept quiet."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.auth import Role
from controlplane.auth import tokens as token_service
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from controlplane.scheduler import LeaderScheduler
from tests.servers import Server, start_server, wait_until

MLP = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.125] * 64}]}
BAD = {"inputs": [{"name": "input", "shape": [1, 63], "datatype": "FP32", "data": [0.5] * 63}]}
QUIET = {"FLIGHTDECK_WORKERS": "1", "FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_HISTORY_INTERVAL_S": "0.2"}


@pytest.fixture
def home(home: Path) -> Path:
    """The shared data directory, private as a real start leaves it (else every process warns of its modes)."""
    for path in (home, *home.glob("flightdeck.db*")):
        path.chmod(0o700 if path.is_dir() else 0o600)
    return home


def _operator_token(home: Path) -> str:
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    with session_factory(engine)() as session:
        user = user_service.create_user(session, "otto", "a-long-password-1", Role.OPERATOR, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "logs", Role.OPERATOR, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return secret


def _history_rows(home: Path) -> int:
    with sqlite3.connect(home / "flightdeck.db") as db:
        return db.execute("SELECT count(*) FROM slot_samples").fetchone()[0]


def _exercise(server: Server, home: Path) -> None:
    """Serve a good and a refused request, and let the scheduler run its jobs several times."""
    assert server.post("/v2/models/mlp/infer", MLP, {"X-Request-ID": "good-one"})[0] == 200
    assert server.post("/v2/models/mlp/infer", BAD, {"X-Request-ID": "bad-shape"})[0] == 400
    before = _history_rows(home)
    # Synchronise on the history-sample job's own rows: each is one APScheduler run ("Running job ...").
    wait_until(lambda: _history_rows(home) >= before + 3, 30, "three runs of the history-sample job")


def _request_lines(home: Path) -> dict[str, list[dict]]:
    lines: dict[str, list[dict]] = {}
    for text in (home / "logs" / "requests.log").read_text().splitlines():
        line = json.loads(text)
        lines.setdefault(line["request_id"], []).append(line)
    return lines


@pytest.mark.slow
def test_json_lines_carry_time_level_logger_message_and_request_id(home: Path) -> None:
    token = _operator_token(home)
    server = start_server(home, {**QUIET, "FLIGHTDECK_LOG_FORMAT": "json", "FLIGHTDECK_LOG_SAMPLE_RATE": "1"})
    try:
        _exercise(server, home)
        tag = urllib.request.Request(
            server.url + "/api/models/mlp/versions/2/tags",
            data=b'["candidate"]',
            method="PUT",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "X-Request-ID": "tag-1"},
        )
        with urllib.request.urlopen(tag, timeout=10) as response:
            assert response.status == 200
    finally:
        assert server.stop() == 0
    records = [json.loads(line) for line in server.output().splitlines()]  # every line, the prepare child's too
    for record in records:
        assert {"timestamp", "level", "logger", "message"} <= set(record), record
        stamp = datetime.fromisoformat(record["timestamp"])
        assert record["timestamp"].endswith("Z") and stamp.utcoffset().total_seconds() == 0
    by_logger = {(r["logger"], r["message"].split(" ")[0]) for r in records}
    assert ("gunicorn.error", "Booting") in by_logger and ("serving.engine", "loaded") in by_logger
    assert not [r for r in records if r["logger"].startswith("apscheduler")]
    tagged = [r for r in records if "tagged mlp version 2" in r["message"]]
    assert [(r["logger"], r.get("request_id")) for r in tagged] == [("controlplane.registry.service", "tag-1")]
    # Request lines: in requests.log once each, never on the terminal.
    assert not [r for r in records if "good-one" in json.dumps(r) or "bad-shape" in json.dumps(r)]
    lines = _request_lines(home)
    assert [(x["version"], x["slot"], x["status"], x["level"]) for x in lines["good-one"]] == [
        ("1", "blue", 200, "INFO")
    ]
    assert [(x["version"], x["slot"], x["status"]) for x in lines["bad-shape"]] == [("1", "blue", 400)]


@pytest.mark.slow
def test_the_terminal_shows_events_not_apscheduler_runs_or_request_lines(home: Path) -> None:
    server = start_server(home, {**QUIET, "FLIGHTDECK_LOG_SAMPLE_RATE": "1"})
    try:
        _exercise(server, home)
    finally:
        assert server.stop() == 0
    output = server.output()
    assert "Running job" not in output and "executed successfully" not in output and "apscheduler" not in output
    assert "good-one" not in output and "bad-shape" not in output  # the request log is written once, to its file
    events = output.splitlines()
    assert sum("Flightdeck is running at " in line for line in events) == 1
    assert sum("loaded mlp version 1 into blue" in line for line in events) == 1
    assert sum(" ready: mlp 1 (blue)" in line for line in events) == 1  # the worker, once it serves
    assert sum("drained: all requests finished" in line for line in events) == 1
    # One human-readable shape: "2026-12-01T17:20:32Z INFO [pid] logger: message".
    assert all(line[:20].endswith("Z") and line.split(" ")[1] == "INFO" for line in events), events
    assert sum("created user 'admin'" in line for line in events) == 1  # the prepare child, same format
    assert len(events) < 20, events  # a quiet start: no per-run or per-request chatter
    assert [len(found) for found in _request_lines(home).values()] == [1, 1]


def test_jobs_are_named_in_apschedulers_own_messages(sessions, caplog) -> None:
    caplog.set_level(logging.INFO, logger="apscheduler")
    ran = threading.Event()
    scheduler = LeaderScheduler(sessions, ttl_s=30)
    scheduler.add_cluster_job(ran.set, 0.05, "alert-evaluator")
    scheduler.start()
    try:
        assert ran.wait(10)  # the leader (the only process here) ran it
    finally:
        scheduler.shutdown()
    running = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Running job")]
    assert running and all('Running job "alert-evaluator (trigger' in m or "lease-renewal" in m for m in running)
    assert not [r for r in caplog.records if "<locals>" in r.getMessage()]
