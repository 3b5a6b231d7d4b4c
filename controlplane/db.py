"""Database engine and per-request sessions (flaskr's get_db/close_db shape, SQLAlchemy 2.0 style)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
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


def _json_loads(text: str | bytes) -> Any:
    """Decode a JSON column with orjson (4x the standard library's speed on history rows), falling back to the
    standard library for what orjson refuses and `json.dumps` writes: NaN and Infinity."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def make_engine(url: str) -> Engine:
    """Create an engine; SQLite gets WAL mode, a busy timeout and foreign keys on every connection.

    JSON columns are decoded by `_json_loads`: the leader's periodic jobs read thousands of history rows, each
    with a few JSON columns (histograms, label counts, input summaries).
    """
    if url.startswith("sqlite"):
        path = sqlite_file(url)
        if path is not None:
            _create_private(path)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            json_deserializer=_json_loads,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, json_deserializer=_json_loads)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Return the session factory bound to an engine; on PostgreSQL its desired-state writes NOTIFY."""
    factory = sessionmaker(engine, expire_on_commit=False)
    if engine.dialect.name == "postgresql":
        announce_desired_changes(factory)  # every node's reconciler wakes when the write commits
    return factory
