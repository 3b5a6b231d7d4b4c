"""Noticing other processes' commits: the change counter, the folder watch, and the reconciler using them."""

from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from controlplane.desiredchanges import ChangeSignal, DirectoryWatch
from tests.servers import wait_until


def _database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x INTEGER)")
    return conn


def test_the_change_signal_sees_commits_by_other_connections_only(tmp_path: Path) -> None:
    writer = _database(tmp_path / "db.sqlite")
    signal = ChangeSignal(str(tmp_path / "db.sqlite"))
    try:
        assert signal.changed()  # the first look has nothing to compare with
        assert not signal.changed()
        writer.execute("SELECT count(*) FROM t").fetchone()
        assert not signal.changed()  # a read is not a change
        writer.execute("INSERT INTO t VALUES (1)")
        assert signal.changed()
        assert not signal.changed()
        writer.execute("BEGIN")
        writer.execute("INSERT INTO t VALUES (2)")
        assert not signal.changed()  # not committed yet
        writer.execute("COMMIT")
        assert signal.changed()
    finally:
        signal.close()
        writer.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_the_directory_watch_calls_back_on_a_commit_and_stops(tmp_path: Path) -> None:
    writer = _database(tmp_path / "db.sqlite")
    seen = threading.Event()
    watch = DirectoryWatch(str(tmp_path), seen.set)
    assert watch.start()
    try:
        writer.execute("INSERT INTO t VALUES (1)")
        assert seen.wait(5), "a commit in the watched folder did not call back"
    finally:
        watch.stop()
        writer.close()


def test_a_missing_folder_means_no_watch(tmp_path: Path) -> None:
    assert not DirectoryWatch(str(tmp_path / "absent"), lambda: None).start()


def test_the_reconciler_applies_another_processs_write_without_being_woken(app, home: Path) -> None:
    """Another process's commit (a plain sqlite3 connection here) reaches this engine with no wake() call."""
    engine = app.extensions["flightdeck"].engine
    assert engine.batching.max_queue_size != 9
    other = sqlite3.connect(home / "flightdeck.db", isolation_level=None, timeout=5)
    try:
        other.execute("UPDATE engine_desired SET generation = generation + 1, max_queue_size = 9 WHERE id = 1")
        assert other.total_changes == 1
    finally:
        other.close()
    wait_until(lambda: engine.batching.max_queue_size == 9, 10, "the reconciler to apply the other process's write")


def test_the_fingerprint_is_the_desired_state_rows_and_moves_with_them_only(app, home: Path) -> None:
    signal = ChangeSignal(str(home / "flightdeck.db"))
    other = sqlite3.connect(home / "flightdeck.db", isolation_level=None, timeout=5)
    try:
        before = signal.fingerprint()
        assert before is not None and len(before) == 2  # deployments, engine_desired
        other.execute("UPDATE engine_status SET error = 'elsewhere'")  # a heartbeat-like commit
        assert signal.fingerprint() == before
        other.execute("UPDATE engine_desired SET max_queue_size = 7 WHERE id = 1")
        assert signal.fingerprint() != before
    finally:
        other.close()
        signal.close()


def test_commits_that_leave_the_desired_state_alone_cost_no_pass(app, home: Path, monkeypatch) -> None:
    """Heartbeats and history rows commit every few seconds; only a desired-state write may start a pass."""
    from controlplane.rollout.reconciler import Reconciler

    services = app.extensions["flightdeck"]
    services.reconciler.heartbeat_s = 3600.0  # NOTE: no pass for the heartbeat's sake during the test
    passes, looked = [], threading.Semaphore(0)
    real_reconcile, real_fingerprint = Reconciler.reconcile, ChangeSignal.fingerprint

    def reconcile(self: Reconciler) -> int:
        passes.append(threading.current_thread().name)
        return real_reconcile(self)

    def fingerprint(self: ChangeSignal) -> tuple | None:
        rows = real_fingerprint(self)
        looked.release()
        return rows

    monkeypatch.setattr(Reconciler, "reconcile", reconcile)
    monkeypatch.setattr(ChangeSignal, "fingerprint", fingerprint)
    other = sqlite3.connect(home / "flightdeck.db", isolation_level=None, timeout=5)
    try:
        for n in range(5):
            other.execute("UPDATE engine_status SET error = ?", (f"commit {n}",))
            assert looked.acquire(timeout=10), "the reconciler did not look at a commit"
        assert passes == []
        other.execute("UPDATE engine_desired SET generation = generation + 1, max_queue_size = 9 WHERE id = 1")
    finally:
        other.close()
    engine = services.engine
    wait_until(lambda: engine.batching.max_queue_size == 9, 10, "the reconciler to apply the other process's write")
    assert passes == ["reconciler"]
