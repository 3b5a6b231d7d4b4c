"""Shared fixtures: the demo models and a prepared data directory (each built once), apps over a copy, servers.

Under pytest-xdist (`make test`), the demo models and the template home are built once per run by
whichever worker asks first and reused by the others, and the scheduler below keeps each test file
on one worker, except `tests/e2e/` and `tests/public_models/`, whose session-wide browser and server
stay on one worker each. Files with slow tests are handed out first, so they never finish last.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.demo_models import write_demo_models

ROOT = Path(__file__).resolve().parent.parent
DB_FILE = "flightdeck.db"
# Folders whose session-scoped fixtures (one browser, one server with the public models) are worth one worker each.
ONE_WORKER_FOLDERS = ("tests/e2e/", "tests/public_models/")
# The longest sequence apps and servers in tests warm up (the product's default, 128, costs ~1.5 s a start).
WARMUP_MAX_SEQUENCE = 16
# Fixtures that start a real server, a PostgreSQL cluster or an S3 endpoint: a test asking for one is slow.
SLOW_FIXTURES = {"server", "cluster", "pg_cluster", "pg_sessions", "s3_endpoint"}
# And these, by node id prefix: real servers started by the test itself, promtool, long in-process runs.
SLOW_TESTS = (
    "tests/controlplane/test_server.py",
    "tests/controlplane/test_failover.py",
    "tests/controlplane/rollout/test_recovery.py",
    "tests/controlplane/rollout/test_zero_downtime.py",
    "tests/controlplane/rollout/test_cli_wait.py",
    "tests/controlplane/rollout/test_engine_control.py",
    "tests/deploy/test_wait_for_schema.py",
    "tests/dashboards/test_prometheus_nodes.py",
    "tests/dashboards/test_prometheus_slo.py::test_promtool",
    "tests/dashboards/test_prometheus_rules.py::test_promtool",
    "tests/serving/test_memory.py::test_mixed_lengths",
    "tests/serving/test_memory.py::test_compaction_while",
    "tests/controlplane/history/test_retention.py::test_two_simulated_days",
    "tests/controlplane/test_served_set.py::test_an_old_home_is_migrated",
    "tests/controlplane/test_layering.py::test_every_module_imports_in_a_fresh_interpreter",
    "tests/controlplane/test_metricsflush.py::test_counts_from_two_processes",
    "tests/bench/test_engine_bench.py::test_mixed_shape_part",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark what starts real servers slow, then put files with slow tests first (order within a file kept)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            item.nodeid.startswith(ONE_WORKER_FOLDERS + SLOW_TESTS)
            or fixtures & SLOW_FIXTURES
            or any(name.endswith("_server") for name in fixtures)
        ):
            item.add_marker(pytest.mark.slow)
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # NOTE: stable, so each file keeps its order


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Schedule by file (module fixtures built once), a one-worker folder as one unit, in collection order."""
    if config.getoption("dist") not in ("load", "loadfile"):
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            folder = next((f for f in ONE_WORKER_FOLDERS if nodeid.startswith(f)), None)
            return folder or super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # NOTE: keep the slow-first order made above
    return ByFile(config, log)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """Return the folder `name`, built by `build` once per test run (shared by xdist's workers under a lock)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.mktemp(name)
        build(path)
        return path
    root = tmp_path_factory.getbasetemp().parent  # NOTE: this run's folder, shared by its workers only
    path = root / name
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / f"{name}.built").exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            (root / f"{name}.built").touch()
    return path


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the demo models once per test run (plain <name>/<version>/ folders)."""
    return built_once(tmp_path_factory, "store", write_demo_models)


@pytest.fixture(scope="session")
def template_home(tmp_path_factory: pytest.TempPathFactory, demo_store: Path) -> Path:
    """A data directory prepared once, as a first start does: schema, demo models pushed and v1 of each deployed.

    Pushing runs every registry check (ONNX Runtime load, golden samples), seconds per start;
    tests get a copy instead (`copy_home`).
    """
    return (
        built_once(tmp_path_factory, "template", lambda folder: _prepare_template(folder / "home", demo_store)) / "home"
    )


def _prepare_template(path: Path, demo_store: Path) -> None:
    from sqlalchemy import delete

    from controlplane.config import load_settings
    from controlplane.db import make_engine, session_factory
    from controlplane.migrate import upgrade
    from controlplane.models import AuditEvent
    from controlplane.modelstore import prepare_home, seed_demo_models

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
    Warm-up stops at short sequences: the text model's batch of 32 at 128 tokens cost ~1.5 s per app
    (warm-up itself is tested on the engine, at the product's default).
    Receivers may reach 127.0.0.1, where the tests' chat servers listen (the product refuses loopback).
    Batches are bounded by the max batch size only, not by a cost curve timed on this machine, and lone requests
    share the batch session (no second session timed at each load); both are tested apart.
    """
    return {
        "home": str(home),
        "warmup_max_sequence": WARMUP_MAX_SEQUENCE,
        "batch_limit_from_cost": False,
        "ort_lone_request_session": False,
        "scheduler": False,
        "log_sample_rate": 1.0,
        "auth_reads": False,
        "demo_models": False,
        "receiver_allow": "127.0.0.1",
    }


# ONNX Runtime sessions of unchanged model files, shared by the apps a test process builds (`app`): bounded, oldest out.
_SESSIONS: dict[tuple, Any] = {}  # key -> serving.runtime.Session (imported late, as in the fixtures)
_SESSIONS_KEPT = 8


@pytest.fixture
def shared_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apps in this test reuse the ONNX Runtime sessions earlier apps made from the same file and settings.

    Creating the demo sessions was ~60 % of a `create_app` (the text model is 42 MB); homes hard-link the
    template's files, so the same inode comes back test after test. Each app still gets its own `Session`
    (gate, arena ledger) and runs its warm-up; engine tests that are about loading build their own engines.
    """
    from serving import engine, runtime
    from serving.settings import RuntimeSettings

    def load_session(path: Path, settings: RuntimeSettings) -> runtime.Session:
        st = Path(path).stat()
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, settings)
        made = _SESSIONS.pop(key, None) or runtime.load_session(path, settings)
        _SESSIONS[key] = made  # NOTE: re-inserted last: dicts keep insertion order, so the first key is the oldest
        while len(_SESSIONS) > _SESSIONS_KEPT:
            del _SESSIONS[next(iter(_SESSIONS))]
        return runtime.Session(session=made.session, provider=made.provider, output_names=list(made.output_names))

    monkeypatch.setattr(engine, "load_session", load_session)


@pytest.fixture
def app(app_config: dict, shared_sessions: None) -> Iterator:
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


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite file migrated to the newest schema once per run (every migration costs ~0.6 s a file)."""

    def build(folder: Path) -> None:
        from controlplane.migrate import upgrade

        upgrade(f"sqlite:///{folder / DB_FILE}")
        with contextlib.closing(sqlite3.connect(folder / DB_FILE)) as db:
            db.execute("pragma wal_checkpoint(truncate)")  # NOTE: so that the one file holds the whole schema

    return built_once(tmp_path_factory, "migrated", build) / DB_FILE


@pytest.fixture
def sessions(tmp_path: Path, migrated_db: Path) -> Iterator:
    """Sessions over a fresh SQLite file migrated to the newest schema (nothing else in it): a copy of one."""
    from controlplane.db import make_engine, session_factory

    shutil.copyfile(migrated_db, tmp_path / DB_FILE)
    url = f"sqlite:///{tmp_path / DB_FILE}"
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()
