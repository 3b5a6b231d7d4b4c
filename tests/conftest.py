"""Shared fixtures: the demo models and a prepared data directory (each built once), apps over a copy, servers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.demo_models import write_demo_models

ROOT = Path(__file__).resolve().parent.parent
DB_FILE = "flightdeck.db"


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the demo models once per test session (plain <name>/<version>/ folders)."""
    store = tmp_path_factory.mktemp("store")
    write_demo_models(store)
    return store


@pytest.fixture(scope="session")
def template_home(tmp_path_factory: pytest.TempPathFactory, demo_store: Path) -> Path:
    """A data directory prepared once, as a first start does: schema, demo models pushed and v1 of each deployed.

    Pushing runs every registry check (ONNX Runtime load, golden samples), seconds per start;
    tests get a copy instead (`copy_home`).
    """
    from sqlalchemy import delete

    from controlplane.config import load_settings
    from controlplane.db import make_engine, session_factory
    from controlplane.migrate import upgrade
    from controlplane.models import AuditEvent
    from controlplane.modelstore import prepare_home, seed_demo_models

    path = tmp_path_factory.mktemp("template") / "home"
    settings = load_settings(environ={}, overrides={"home": str(path)})
    prepare_home(settings)
    upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    sessions = session_factory(engine)
    assert seed_demo_models(settings, sessions, built=demo_store) == ["mlp", "textcls"]
    with sessions() as session:
        # Tests count the audit events they cause; the seeding's own trail is tested where a real start makes it.
        session.execute(delete(AuditEvent))
        session.commit()
    engine.dispose()  # NOTE: checkpoints SQLite's WAL, so the one database file holds everything
    return path


def copy_home(template: Path, home: Path) -> Path:
    """Give `home` the template's database (copied) and registry (hard links: stored versions never change)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template / DB_FILE, home / DB_FILE)
    shutil.copytree(template / "registry", home / "registry", copy_function=os.link)
    return home


def link_store(demo_store: Path, home: Path) -> None:
    """Give a data directory an old-style HOME/models store of the demo models (links, not copies)."""
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
def home(tmp_path: Path, template_home: Path) -> Path:
    """A fresh FLIGHTDECK_HOME: a migrated SQLite database, the demo models in the registry, v1 of each deployed."""
    return copy_home(template_home, tmp_path / "home")


@pytest.fixture
def app_config(home: Path) -> dict:
    """Overrides for create_app; tests may update it before asking for `app`.

    Reads are open here so that tests about serving, history or rollouts can GET without a token;
    access control is tested in tests/controlplane/auth, against the product default (reads need a viewer).
    No demo seeding: `home` already holds the demo models, and a home a test empties stays empty.
    Receivers may reach 127.0.0.1, where the tests' chat servers listen (the product refuses loopback).
    """
    return {
        "home": str(home),
        "scheduler": False,
        "log_sample_rate": 1.0,
        "auth_reads": False,
        "demo_models": False,
        "receiver_allow": "127.0.0.1",
    }


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


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator:
    """Sessions over a fresh SQLite file migrated to the newest schema (nothing else in it)."""
    from controlplane.db import make_engine, session_factory
    from controlplane.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'flightdeck.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()
