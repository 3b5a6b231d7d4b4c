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
