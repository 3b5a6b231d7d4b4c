"""Noticing, without polling queries, that another process committed to the SQLite database.

The reconciler of every serving process must see desired state written by the others within a few
milliseconds, and an idle process should cost (almost) nothing. Two cheap signals do that on SQLite:

- `ChangeSignal`: `PRAGMA data_version` on a connection kept for it. It is read from the shared
  WAL index (no query plan, no table read) and changes only when another connection committed.
- `DirectoryWatch`: inotify on the database's folder (Linux). A commit writes the -wal file, which
  wakes a thread blocked in `poll`; nothing runs between commits. Where inotify is missing, the
  reconciler falls back to reading `ChangeSignal` every poll.

PostgreSQL has neither: its reconciler polls (LISTEN/NOTIFY is the several-nodes issue's).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import sqlite3
import sys
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

# From <sys/inotify.h>: a file in the folder was written, created, or moved in.
IN_MODIFY, IN_MOVED_TO, IN_CREATE = 0x2, 0x80, 0x100


def sqlite_path(sessions: sessionmaker[Session]) -> str | None:
    """Return the database file behind `sessions` when it is a file-backed SQLite database, else None."""
    url = getattr(sessions.kw.get("bind"), "url", None)
    if url is None or url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return url.database


class ChangeSignal:
    """Tell whether another connection committed to a SQLite file since the last look, without a query.

    NOTE: `PRAGMA data_version` changes only for commits by other connections, which includes this
    process's own sessions, so a write here is seen too. Use from one thread at a time.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._last: int | None = None

    def changed(self) -> bool:
        """Return True when something committed since the last call (and on the first call, or on an error)."""
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            log.warning("could not read the database's change counter; reconciling anyway", exc_info=True)
            self.close()
            return True
        changed, self._last = version != self._last, version
        return changed

    def close(self) -> None:
        """Close the kept connection (a later `changed()` reopens it)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._last = None


class DirectoryWatch:
    """Call `on_change` whenever a file in `folder` is written (inotify); `start()` says whether it could."""

    def __init__(self, folder: str, on_change: Callable[[], None]) -> None:
        self._folder = folder
        self._on_change = on_change
        self._fd = -1
        self._stop_pipe: tuple[int, int] | None = None  # written to by stop(), so the thread leaves at once
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start watching in a background thread; return False (and watch nothing) where inotify is missing."""
        if not sys.platform.startswith("linux"):
            return False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            if libc.inotify_add_watch(fd, os.fsencode(self._folder), IN_MODIFY | IN_MOVED_TO | IN_CREATE) < 0:
                os.close(fd)
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {self._folder}")
        except (OSError, AttributeError) as exc:
            log.info("no inotify on %s (%s): polling the database's change counter instead", self._folder, exc)
            return False
        self._fd = fd
        self._stop_pipe = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(fd, self._stop_pipe[0]), name="db-watch", daemon=True)
        self._thread.start()
        return True

    def _run(self, fd: int, stop_fd: int) -> None:
        poller = select.poll()  # NOTE: not select.select, which fails on descriptors above 1023
        poller.register(fd, select.POLLIN)
        poller.register(stop_fd, select.POLLIN)
        while True:
            ready = {ready_fd for ready_fd, _ in poller.poll()}
            if stop_fd in ready:
                return
            try:
                while os.read(fd, 65536):  # drain: one wake-up for a burst of writes
                    pass
            except BlockingIOError:
                pass
            self._on_change()

    def stop(self) -> None:
        """Stop the thread and close the inotify descriptor."""
        if self._stop_pipe is None:
            return
        os.write(self._stop_pipe[1], b"x")
        if self._thread is not None:
            self._thread.join(5)
        for fd in (self._fd, *self._stop_pipe):
            os.close(fd)
        self._fd, self._stop_pipe, self._thread = -1, None, None
