"""Database engine and per-request sessions (flaskr's get_db/close_db shape, SQLAlchemy 2.0 style)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from controlplane.desiredchanges import announce_desired_changes

SQLITE_BUSY_TIMEOUT_MS = 5000


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # NOTE: WAL lets readers run beside the one writer; busy_timeout makes writers queue, not fail.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def sqlite_file(url: str) -> Path | None:
    """Return the file of a SQLite URL, or None (another database, or in memory)."""
    if not url.startswith("sqlite"):
        return None
    database = make_url(url).database
    return Path(database) if database and database != ":memory:" and not database.startswith("file:") else None


def _create_private(path: Path) -> None:
    """Create an empty database file readable by this OS user only, unless one exists.

    NOTE: SQLite gives the -wal and -shm files the mode of the database file, so creating it 0600
    before SQLite does keeps all three private whatever the umask (password hashes live there).
    """
    if not path.parent.is_dir():
        return  # SQLite will say so itself
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def make_engine(url: str) -> Engine:
    """Create an engine; SQLite gets WAL mode, a busy timeout and foreign keys on every connection."""
    if url.startswith("sqlite"):
        path = sqlite_file(url)
        if path is not None:
            _create_private(path)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Return the session factory bound to an engine; on PostgreSQL its desired-state writes NOTIFY."""
    factory = sessionmaker(engine, expire_on_commit=False)
    if engine.dialect.name == "postgresql":
        announce_desired_changes(factory)  # every node's reconciler wakes when the write commits
    return factory
