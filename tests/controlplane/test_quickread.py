"""Quick yes-or-no reads (`controlplane.quickread`) against real SQLite files: always the latest commit."""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, create_engine, exists, insert, select

from controlplane import quickread
from controlplane.db import make_engine, session_factory

METADATA = MetaData()
THINGS = Table("things", METADATA, Column("id", Integer, primary_key=True), Column("state", Integer))
ANY_OPEN = select(exists().where(THINGS.c.state == 1))


def _sessions(url: str):
    engine = make_engine(url) if url != "sqlite://" else create_engine(url)
    METADATA.create_all(engine)
    return session_factory(engine)


def _write(sessions, *statements) -> None:
    with sessions() as session, session.begin():
        for statement in statements:
            session.execute(statement)


def test_every_answer_sees_the_commits_made_before_it(tmp_path: Path) -> None:
    sessions = _sessions(f"sqlite:///{tmp_path / 'a.db'}")
    assert not quickread.holds(sessions, ANY_OPEN)
    for turn in range(3):  # the one connection kept must not hold an old snapshot between questions
        _write(sessions, insert(THINGS).values(id=turn, state=1))
        assert quickread.holds(sessions, ANY_OPEN)
        _write(sessions, THINGS.update().values(state=0))
        assert not quickread.holds(sessions, ANY_OPEN)


def test_a_database_without_a_file_is_asked_through_a_session() -> None:
    sessions = _sessions("sqlite://")  # in memory: another connection would see another, empty database
    _write(sessions, insert(THINGS).values(id=1, state=1))
    assert quickread.holds(sessions, ANY_OPEN)


def test_only_a_few_connections_are_kept_open(tmp_path: Path) -> None:
    for n in range(quickread.KEPT_CONNECTIONS + 3):
        sessions = _sessions(f"sqlite:///{tmp_path / f'{n}.db'}")
        _write(sessions, insert(THINGS).values(id=1, state=n % 2))
        assert quickread.holds(sessions, ANY_OPEN) == bool(n % 2)
    assert len(quickread._connections) <= quickread.KEPT_CONNECTIONS


def _ask_in_child(url: str, answers) -> None:
    sessions = _sessions(url)
    _write(sessions, THINGS.update().values(state=0))
    answers.put(quickread.holds(sessions, ANY_OPEN))


def test_a_forked_child_asks_on_its_own_connection(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fork.db'}"
    sessions = _sessions(url)
    _write(sessions, insert(THINGS).values(id=1, state=1))
    assert quickread.holds(sessions, ANY_OPEN)  # the parent's connection exists before the fork
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_ask_in_child, args=(url, answers))
    child.start()
    assert answers.get(timeout=30) is False
    child.join(30)
    assert child.exitcode == 0
    assert not quickread.holds(sessions, ANY_OPEN)  # and the parent's still answers


def _files_open(path: Path) -> int:
    """How many of this process's descriptors are open on `path` or its -wal and -shm files."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd).startswith(str(path)))


def _push_out_in_child(db: Path, others: Path, answers) -> None:
    before = _files_open(db)
    for n in range(quickread.KEPT_CONNECTIONS + 1):  # each a connection of the child's own, the parent's pushed out
        sessions = _sessions(f"sqlite:///{others / f'{n}.db'}")
        quickread.holds(sessions, ANY_OPEN)
    gc.collect()
    answers.put((before, _files_open(db)))


def test_a_forked_child_never_closes_its_parents_connection(tmp_path: Path) -> None:
    """SQLite's connections must not be closed across fork; freeing one closes it, so a child keeps them."""
    db = tmp_path / "parent.db"
    sessions = _sessions(f"sqlite:///{db}")
    assert not quickread.holds(sessions, ANY_OPEN)  # the parent's connection is kept before the fork
    (tmp_path / "child").mkdir()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_push_out_in_child, args=(db, tmp_path / "child", answers))
    child.start()
    before, after = answers.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert before >= 1 and after == before
