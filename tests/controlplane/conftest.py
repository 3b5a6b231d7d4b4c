"""Fixtures for control-plane tests: a session factory over a real migrated SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.db import make_engine, session_factory
from controlplane.migrate import upgrade


@pytest.fixture
def sessions(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'history.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()
