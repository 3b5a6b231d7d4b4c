"""Yes-or-no reads that the leader's frequent jobs ask before opening a session.

The leader ticks the rollouts every second, sweeps runbooks every 2 s and the outbox every 5 s, and
nearly always finds nothing to do. Through a session each "nothing" cost 0.6-0.8 ms of CPU in an idle
worker (the connection's checkout and rollback, the statement's cache key); the read itself, on SQLite,
takes 6 µs. On SQLite a question therefore runs on one connection of this process's own, compiled
once; on another database (PostgreSQL) it runs in a session, as any read does.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from weakref import WeakKeyDictionary

from sqlalchemy import Engine, Select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.db import sqlite_file
from controlplane.desiredchanges import open_reader

log = logging.getLogger(__name__)

_lock = threading.Lock()
KEPT_CONNECTIONS = 4  # a server uses one database; a test run opens hundreds, and each connection holds 3 files
_connections: OrderedDict[tuple[int, str], sqlite3.Connection] = OrderedDict()  # by (pid, file), latest last
_compiled: dict[int, tuple[Select, str]] = {}  # by id(question); the question is kept, so its id stays its own
_files: WeakKeyDictionary[Engine, str | None] = WeakKeyDictionary()
# A parent's connections that a forked child pushed out of `_connections`: held, never used, never closed.
_inherited: list[sqlite3.Connection] = []


def holds(sessions: sessionmaker[Session], question: Select) -> bool:
    """Return whether `question`, a SELECT of one value (an EXISTS), is true now.

    It sees every commit made before the call, as a new session would.
    """
    engine = sessions.kw.get("bind")
    path = _file_of(engine) if isinstance(engine, Engine) else None
    if path is not None:
        try:
            return _ask_sqlite(path, engine.dialect, question)
        except sqlite3.Error:
            log.warning("quick read on %s failed; asking through a session", path, exc_info=True)
            _forget(path)
    with sessions() as session:
        return bool(session.scalar(question))


def _file_of(engine: Engine) -> str | None:
    """The SQLite file behind `engine`, or None (another database, or SQLite in memory)."""
    try:
        return _files[engine]
    except KeyError:
        path = sqlite_file(str(engine.url)) if engine.dialect.name == "sqlite" else None
        _files[engine] = found = str(path) if path is not None else None
        return found


def _ask_sqlite(path: str, dialect: object, question: Select) -> bool:
    with _lock:  # NOTE: one connection per process, used by one thread at a time (jobs run on a pool)
        kept = _compiled.get(id(question))
        if kept is None:
            sql = str(question.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))  # type: ignore[arg-type]
            kept = _compiled[id(question)] = (question, sql)
        key = (os.getpid(), path)  # NOTE: a forked child opens its own
        connection = _connections.get(key)
        if connection is None:
            connection = _connections[key] = open_reader(path)
            while len(_connections) > KEPT_CONNECTIONS:
                (pid, _), oldest = _connections.popitem(last=False)
                if pid == os.getpid():
                    oldest.close()
                else:  # NOTE: a parent's, not to be closed across fork, nor freed, which closes it too
                    _inherited.append(oldest)
        _connections.move_to_end(key)
        row = connection.execute(kept[1]).fetchone()
    return bool(row and row[0])


def _forget(path: str) -> None:
    with _lock:
        connection = _connections.pop((os.getpid(), path), None)
    if connection is not None:
        connection.close()
