"""Noticing, without polling queries, that another process or node changed the desired state.

The reconciler of every serving process must see desired state written by the others within a few
milliseconds, and an idle process should cost (almost) nothing. Two cheap signals do that on SQLite:

- `ChangeSignal`: `PRAGMA data_version` on a connection kept for it. It is read from the shared
  WAL index (no query plan, no table read) and changes only when another connection committed.
  Most commits are heartbeats and history rows, so its `fingerprint` (the desired-state rows, read
  on the same connection) tells whether a commit changed anything the reconciler applies.
- `DirectoryWatch`: inotify on the database's folder (Linux). A commit writes the -wal file, which
  wakes a thread blocked in `poll`; nothing runs between commits. Where inotify is missing, the
  reconciler falls back to reading `ChangeSignal` every poll.

PostgreSQL has neither, and its nodes may be on other hosts, so desired state announces itself:

- `announce_desired_changes`: every session that writes `deployments` or `engine_desired` also
  sends `NOTIFY flightdeck_desired` in the same transaction, so the announcement arrives exactly
  when (and only if) the write is committed.
- `PostgresListener`: one connection per process `LISTEN`s on that channel in a thread blocked in
  `poll`, and wakes the reconciler. The reconciler still reads the tables on a slow timer as a
  safety net (a notification lost with a dropped connection).
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
from typing import TYPE_CHECKING

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, sessionmaker

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# From <sys/inotify.h>: a file in the folder was written, created, or moved in.
IN_MODIFY, IN_MOVED_TO, IN_CREATE = 0x2, 0x80, 0x100
CHANNEL = "flightdeck_desired"
DESIRED_TABLES = ("deployments", "engine_desired")  # what every reconciler applies
RECONNECT_S = 1.0  # a lost LISTEN connection is tried again this often (the safety poll covers the gap)


def sqlite_path(sessions: sessionmaker[Session]) -> str | None:
    """Return the database file behind `sessions` when it is a file-backed SQLite database, else None."""
    url = getattr(sessions.kw.get("bind"), "url", None)
    if url is None or url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return url.database


def open_reader(path: str) -> sqlite3.Connection:
    """A connection of its own to a SQLite file for small raw reads (also `controlplane.quickread`).

    isolation_level=None: no transaction is left open between reads, so each sees the latest commit and none
    holds back a checkpoint. Usable from any thread, one at a time. (sqlite3's default busy timeout, 5 s, is the
    one controlplane.db gives its engines.)
    """
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


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
            version = self._connection().execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            log.warning("could not read the database's change counter; reconciling anyway", exc_info=True)
            self.close()
            return True
        changed, self._last = version != self._last, version
        return changed

    def fingerprint(self) -> tuple | None:
        """Return every row of the desired-state tables as they are now, or None when they could not be read.

        A commit elsewhere (a heartbeat, a history row) changes `data_version` but not these rows; a reader
        that compares fingerprints skips a pass for it. Read on the kept connection: no SQLAlchemy, a few µs.
        """
        try:
            connection = self._connection()
            # NOTE: `SELECT *`, so a column added later is covered without a change here.
            return tuple(tuple(connection.execute(f"SELECT * FROM {table} ORDER BY 1")) for table in DESIRED_TABLES)
        except sqlite3.Error:
            log.warning("could not read the desired-state tables directly; reconciling anyway", exc_info=True)
            return None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_reader(self._path)
        return self._conn

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


def postgres_url(sessions: sessionmaker[Session]) -> URL | None:
    """Return the URL behind `sessions` when it is a PostgreSQL database, else None."""
    url = getattr(sessions.kw.get("bind"), "url", None)
    return url if url is not None and url.get_backend_name() == "postgresql" else None


def announce_desired_changes(sessions: sessionmaker[Session]) -> None:
    """Make every session of `sessions` NOTIFY `CHANNEL` in the transaction that writes desired state."""
    event.listen(sessions, "after_flush", _after_flush)
    event.listen(sessions, "do_orm_execute", _before_bulk_write)


def _writes_desired(session: Session) -> bool:
    objects = (*session.new, *session.dirty, *session.deleted)
    return any(getattr(getattr(obj, "__table__", None), "name", None) in DESIRED_TABLES for obj in objects)


def _after_flush(session: Session, _flush: UOWTransaction) -> None:
    # NOTE: after_flush still sees the flushed objects in new/dirty/deleted; NOTIFY joins their transaction.
    if _writes_desired(session):
        session.connection().exec_driver_sql(f"NOTIFY {CHANNEL}")


def _before_bulk_write(state: ORMExecuteState) -> None:
    """Announce an `update(Deployment)`/`delete(...)` statement, which the unit of work never sees."""
    if not (state.is_update or state.is_delete or state.is_insert):
        return
    table = getattr(state.statement, "table", None)
    if getattr(table, "name", None) in DESIRED_TABLES:
        state.session.connection().exec_driver_sql(f"NOTIFY {CHANNEL}")


class PostgresListener:
    """Call `on_change` whenever a NOTIFY on `CHANNEL` arrives; `start()` says whether it could LISTEN.

    A connection of its own, in autocommit, waits in `poll` beside a stop pipe: nothing runs between
    notifications. A lost connection is reopened every `RECONNECT_S`, and `on_change` is called once
    it is back, since notifications sent meanwhile are lost.
    """

    def __init__(self, url: URL, on_change: Callable[[], None]) -> None:
        # NOTE: psycopg takes the URL without SQLAlchemy's "+psycopg" driver suffix.
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._on_change = on_change
        self._conn: psycopg.Connection | None = None
        self._stop_pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """LISTEN now (so nothing committed after this returns is missed) and wait in a background thread."""
        try:
            self._conn = self._connect()
        except Exception as exc:
            log.warning("could not LISTEN for desired-state changes (%s): polling every second instead", exc)
            return False
        self._stop_pipe = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(self._stop_pipe[0],), name="db-listen", daemon=True)
        self._thread.start()
        return True

    def _connect(self) -> psycopg.Connection:
        import psycopg  # the `postgres` extra: only a PostgreSQL deployment needs it

        # Keepalives: a peer that vanished without closing the socket is noticed within a minute.
        conn = psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=10, keepalives=1, keepalives_idle=20,
            keepalives_interval=5, keepalives_count=3, application_name="flightdeck-listen",
        )  # fmt: skip
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def _run(self, stop_fd: int) -> None:
        while True:
            if self._conn is None:
                poller = select.poll()
                poller.register(stop_fd, select.POLLIN)
                if poller.poll(RECONNECT_S * 1000):
                    return
                try:
                    self._conn = self._connect()
                except Exception as exc:
                    log.warning("LISTEN connection still down (%s); retrying in %.0f s", exc, RECONNECT_S)
                    continue
                log.info("LISTEN connection restored")
                self._on_change()  # what was announced while it was down is lost: look now
            poller = select.poll()  # NOTE: not select.select, which fails on descriptors above 1023
            poller.register(self._conn.fileno(), select.POLLIN)
            poller.register(stop_fd, select.POLLIN)
            ready = {fd for fd, _ in poller.poll()}
            if stop_fd in ready:
                return
            try:
                if any(True for _ in self._conn.notifies(timeout=0)):
                    self._on_change()
            except Exception as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
                self._close_conn()

    def _close_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                log.debug("closing the LISTEN connection failed", exc_info=True)
            self._conn = None

    def stop(self) -> None:
        """Stop the thread and close the connection."""
        if self._stop_pipe is None:
            return
        os.write(self._stop_pipe[1], b"x")
        if self._thread is not None:
            self._thread.join(5)
        self._close_conn()
        for fd in self._stop_pipe:
            os.close(fd)
        self._stop_pipe, self._thread = None, None
