"""Shared fixtures: the demo model store (built once), apps over a temporary SQLite file, servers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.demo_models import write_demo_models

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the demo models once per test session."""
    store = tmp_path_factory.mktemp("store")
    write_demo_models(store)
    return store


def link_store(demo_store: Path, home: Path) -> None:
    """Give a data directory the demo models without rebuilding them (links, not copies)."""
    models = home / "models"
    models.mkdir(parents=True, exist_ok=True)
    for model in demo_store.iterdir():
        for version in model.iterdir():
            target = models / model.name / version.name
            target.mkdir(parents=True, exist_ok=True)
            for item in version.iterdir():
                dest = target / item.name
                if not dest.exists():
                    os.symlink(item, dest)


@pytest.fixture
def home(tmp_path: Path, demo_store: Path) -> Path:
    """A fresh FLIGHTDECK_HOME holding the demo models and a migrated SQLite database."""
    from controlplane.migrate import upgrade

    path = tmp_path / "home"
    link_store(demo_store, path)
    upgrade(f"sqlite:///{path / 'flightdeck.db'}")
    return path


@pytest.fixture
def app_config(home: Path) -> dict:
    """Overrides for create_app; tests may update it before asking for `app`.

    Reads are open here so that tests about serving, history or rollouts can GET without a token;
    access control is tested in tests/controlplane/auth, against the product default (reads need a viewer).
    """
    return {"home": str(home), "scheduler": False, "log_sample_rate": 1.0, "auth_reads": False}


@pytest.fixture
def app(app_config: dict) -> Iterator:
    from controlplane.app import create_app

    application = create_app(app_config)
    application.testing = True
    yield application
    application.extensions["flightdeck"].shutdown(5)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def server(home: Path):
    """A real gunicorn server over the test's data directory, stopped after the test."""
    from tests.servers import start_server

    running = start_server(home)
    yield running
    running.stop()
