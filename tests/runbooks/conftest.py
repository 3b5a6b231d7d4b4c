"""Runbook fixtures: scripts in a temporary runbooks folder, a database over a temporary SQLite file, accounts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from controlplane.auth import Actor, Role
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from controlplane.models import Base
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.catalog import RunbookCatalog
from controlplane.runbooks.runner import RunbookRunner
from controlplane.runbooks.states import Trigger
from tests.runbooks.fakeapi import FakeApi

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "runbooks"
TEST_SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_script(
    script: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a runbook the way a person does from a shell (a plain environment, no shell in between)."""
    environment = {"PATH": os.environ.get("PATH", os.defpath), **(env or {})}
    return subprocess.run(
        [sys.executable, str(script), *args], env=environment, cwd=cwd or ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def step_lines(stdout: str) -> list[dict]:
    """The step records a script printed."""
    import json

    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"step"')]


def token_for(app, name: str, role: Role) -> dict[str, str]:
    """Create a user with `role` and return the Authorization header of an API token of theirs."""
    from controlplane.auth import tokens as token_service

    with app.extensions["flightdeck"].sessions() as session:
        user = user_service.create_user(session, name, "a-long-password-1", role, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "test", role, datetime.now(UTC))
        session.commit()
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def runbooks_dir(tmp_path: Path) -> Path:
    """A runbooks folder holding the real scripts and the test ones."""
    folder = tmp_path / "runbooks"
    folder.mkdir()
    for script in [*RUNBOOKS.glob("*.py"), *TEST_SCRIPTS.glob("*.py")]:
        shutil.copy(script, folder / script.name)
    return folder


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """Sessions over a fresh SQLite file holding every table (runbook_runs included)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'runbooks.db'}")
    Base.metadata.create_all(engine)
    yield session_factory(engine)
    engine.dispose()


@dataclass
class Clock:
    """A clock the test moves by hand (approval deadlines); starts at the real time, for token checks."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime.now(UTC))


@pytest.fixture
def people(sessions: sessionmaker[Session]) -> dict[str, Actor]:
    """Two operators, an admin and a viewer, as the actors their API tokens would make."""
    actors = {}
    with sessions() as session:
        for name, role in (("otto", Role.OPERATOR), ("olga", Role.OPERATOR), ("ada", Role.ADMIN), ("vic", Role.VIEWER)):
            user = user_service.create_user(session, name, "a-long-password-1", role, datetime.now(UTC))
            actors[name] = Actor(name=name, role=role, kind="token", user_id=user.id)
        session.commit()
    return actors


@pytest.fixture
def runner(
    runbooks_dir: Path, sessions: sessionmaker[Session], clock: Clock, tmp_path: Path
) -> Iterator[RunbookRunner]:
    """A runner over the temporary runbooks folder; its scripts are killed at the end of the test."""
    instance = RunbookRunner(
        RunbookCatalog(runbooks_dir), sessions, api_url="http://127.0.0.1:9", output_dir=tmp_path / "out",
        cwd=runbooks_dir, approval_timeout_s=600, clock=clock,
    )  # fmt: skip
    yield instance
    instance.shutdown()


def start(
    runner: RunbookRunner, sessions: sessionmaker[Session], name: str, params: dict, actor: Actor | None,
    trigger: Trigger = Trigger.PERSON, **options,
) -> int:  # fmt: skip
    """Request a run as the API does (record, commit, launch); return its id."""
    with sessions() as session:
        run = runner.request(session, name, params, actor, trigger, **options)
        session.commit()
    runner.launch(run.id)
    return run.id


def fetch(sessions: sessionmaker[Session], run_id: int) -> RunbookRun:
    with sessions() as session:
        return session.get(RunbookRun, run_id)


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A named pipe a test runbook blocks on until the test writes to it."""
    path = tmp_path / "gate"
    os.mkfifo(path)
    return path


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    """A stand-in server on 127.0.0.1; the test adds its routes."""
    fake = FakeApi().start()
    yield fake
    fake.stop()
