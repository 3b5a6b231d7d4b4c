"""Several nodes on one PostgreSQL (a throwaway cluster, tests/pg.py): desired-state writes NOTIFY, nodes wake at once.

Two SQLAlchemy engines on the same database stand for two nodes. Skipped only when psycopg or the
PostgreSQL server binaries are absent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")

from sqlalchemy import Engine as DbEngine  # noqa: E402
from sqlalchemy import event, text  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from controlplane.clock import utcnow  # noqa: E402
from controlplane.config import load_settings  # noqa: E402
from controlplane.db import make_engine, session_factory  # noqa: E402
from controlplane.desiredchanges import PostgresListener, postgres_url  # noqa: E402
from controlplane.migrate import upgrade  # noqa: E402
from controlplane.models import EngineStatus, SlotStatus  # noqa: E402
from controlplane.rollout.audit import system_audit  # noqa: E402
from controlplane.rollout.deployments import first_deploy, undeploy  # noqa: E402
from controlplane.rollout.enginewide import BATCHING_LIMITS, set_engine_batching  # noqa: E402
from controlplane.rollout.reconciler import Reconciler  # noqa: E402
from serving.engine import Engine  # noqa: E402
from tests.pg import create_database, find_bindir, postgres_cluster  # noqa: E402
from tests.servers import wait_until  # noqa: E402

PG_BIN = find_bindir()
if PG_BIN is None:
    pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found", allow_module_level=True)

WAKE_LIMIT_S = 0.25  # "well under a second"; measured wake-ups are a few milliseconds


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with postgres_cluster(PG_BIN) as url:
        yield url


@pytest.fixture
def nodes(cluster: str) -> Iterator[tuple[sessionmaker[Session], sessionmaker[Session]]]:
    """Two nodes' session factories over one fresh database upgraded to head."""
    url = create_database(cluster)
    upgrade(url)
    engines = [make_engine(url), make_engine(url)]
    yield session_factory(engines[0]), session_factory(engines[1])
    for engine in engines:
        engine.dispose()


class Notifications:
    """Counts wake-ups from a listener and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float) -> float:
        """Wait until `count` wake-ups arrived; return the monotonic time it happened."""
        with self._cond:
            assert self._cond.wait_for(lambda: self.count >= count, timeout), f"{count} wake-ups never came"
            return time.monotonic()


def _set_queue_size(session: Session, size: int) -> None:
    set_engine_batching(session, {"max_queue_size": size}, "ops", system_audit, dict.fromkeys(BATCHING_LIMITS))


def _engine(tmp_path: Path) -> Engine:
    settings = load_settings(environ={}, overrides={"home": str(tmp_path)})
    return Engine(settings.runtime, settings.batching_settings)


def test_a_desired_state_write_on_one_node_wakes_another_within_milliseconds(nodes) -> None:
    writer, reader = nodes
    heard = Notifications()
    listener = PostgresListener(postgres_url(reader), heard)
    assert listener.start()
    latencies: list[float] = []
    try:
        writes = [
            lambda s: _set_queue_size(s, 9),  # bulk UPDATE
            lambda s: first_deploy(s, "mlp", "1", system_audit),  # ORM insert
            lambda s: undeploy(s, "mlp", system_audit),  # ORM delete
        ]
        for n, write in enumerate(writes, start=1):
            # A status row (what every node writes all the time) and a rolled-back write announce nothing:
            # notifications arrive in commit order, so had they been sent, the count would be ahead below.
            with writer() as s, s.begin():
                s.add(EngineStatus(process=f"p{n}", generation=1, compact_generation=0, error="", updated_at=utcnow()))
            with writer() as s:
                first_deploy(s, "textcls", "1", system_audit)
                s.rollback()
            with writer() as s, s.begin():
                write(s)
                committed = time.monotonic()
            latencies.append(heard.wait_for(n, 5) - committed)
            assert heard.count == n
    finally:
        listener.stop()
    print(f"commit on node A -> NOTIFY heard on node B: {[round(x * 1000, 1) for x in latencies]} ms")
    assert max(latencies) < WAKE_LIMIT_S


def test_a_reconciler_on_another_node_serves_a_first_deploy_at_once(nodes, tmp_path: Path, demo_store: Path) -> None:
    writer, reader = nodes
    served = threading.Event()
    engine = _engine(tmp_path)
    # NOTE: no safety poll within the test: only the NOTIFY can wake node B this fast.
    reconciler = Reconciler(
        engine, reader, lambda m, v: demo_store / m / v, "node-b:1", on_changed=served.set, safety_poll_s=3600
    )
    reconciler.start()
    try:
        woken: list[float] = []
        for write in (lambda s: first_deploy(s, "mlp", "1", system_audit), lambda s: undeploy(s, "mlp", system_audit)):
            served.clear()
            with writer() as s, s.begin():
                write(s)
                committed = time.monotonic()
            assert served.wait(30)
            woken.append(time.monotonic() - committed)
        assert engine.models() == []
    finally:
        reconciler.stop()
    print(
        f"first deploy / undeploy on node A -> done on node B (load, golden check): {[round(x * 1000, 1) for x in woken]} ms"
    )
    assert max(woken) < 1.0


def test_an_idle_node_reads_the_database_at_most_once_a_second(nodes, tmp_path: Path) -> None:
    _writer, reader = nodes
    queries: list[float] = []
    db: DbEngine = reader.kw["bind"]
    engine = _engine(tmp_path)
    reconciler = Reconciler(engine, reader, lambda m, v: tmp_path, "node-b:1", safety_poll_s=1.0)
    reconciler.start()
    try:
        event.listen(db, "before_cursor_execute", lambda *args: queries.append(time.monotonic()))
        # NOTE: not synchronisation: a measurement window over which nothing happens, by design.
        time.sleep(3.2)
        count = len(queries)
    finally:
        reconciler.stop()
    print(f"idle node B, safety poll 1 s: {count} queries in 3.2 s")
    # A pass is two small reads (engine_desired, deployments); at one pass a second, 3.2 s hold at most 4.
    assert count <= 4 * 2, f"{count} queries in 3.2 s of idling"


def test_the_safety_poll_applies_a_write_that_announced_nothing(nodes, tmp_path: Path) -> None:
    writer, reader = nodes
    with writer() as s, s.begin():
        _set_queue_size(s, 5)
    engine = _engine(tmp_path)
    reconciler = Reconciler(engine, reader, lambda m, v: tmp_path, "node-b:1", safety_poll_s=1.0)
    reconciler.start()
    try:
        assert engine.batching.max_queue_size == 5
        # Raw SQL on a plain connection: no session, so no NOTIFY, as from a tool outside Flightdeck.
        with writer.kw["bind"].begin() as conn:
            conn.execute(text("UPDATE engine_desired SET generation = generation + 1, max_queue_size = 7"))
        wait_until(lambda: engine.batching.max_queue_size == 7, 5, "the safety poll to apply the silent write")
    finally:
        reconciler.stop()


def test_a_listener_whose_connection_is_killed_reconnects_and_hears_again(nodes) -> None:
    writer, reader = nodes
    heard = Notifications()
    listener = PostgresListener(postgres_url(reader), heard)
    assert listener.start()
    try:
        with writer() as s, s.begin():
            killed = s.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'flightdeck-listen'"
                )
            ).all()
        assert killed == [(True,)]
        heard.wait_for(1, 10)  # back: told to look, since what was sent meanwhile is lost
        with writer() as s, s.begin():
            s.add(SlotStatus(process="p", model="m", slot="blue", version="1", state="loaded", error="",
                             generation=1, updated_at=utcnow()))  # fmt: skip
            _set_queue_size(s, 9)
        heard.wait_for(2, 5)
    finally:
        listener.stop()
