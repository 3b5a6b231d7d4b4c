"""Outbox claims on a real PostgreSQL (tests/pg.py): two deliverers at once never send one message twice.

Two leaders can overlap for a moment around a hand-over (a paused leader, a lease just taken);
each message is claimed with `SELECT ... FOR UPDATE SKIP LOCKED` for the length of its attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")

from sqlalchemy import select, text  # noqa: E402
from sqlalchemy.exc import OperationalError  # noqa: E402

from controlplane.alerting.outbox import deliver_due  # noqa: E402
from controlplane.db import make_engine, session_factory  # noqa: E402
from controlplane.migrate import upgrade  # noqa: E402
from controlplane.models import OutboxMessage  # noqa: E402
from tests.alerts.notifiers.recorder import deliver_local  # noqa: E402
from tests.controlplane.alerting.test_outbox import queue  # noqa: E402
from tests.controlplane.history.conftest import T0  # noqa: E402
from tests.pg import create_database, find_bindir, postgres_cluster  # noqa: E402
from tests.servers import ChatServer  # noqa: E402

PG_BIN = find_bindir()
if PG_BIN is None:
    pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found", allow_module_level=True)
KILL_LOCK_HOLDER = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE state = 'idle in transaction' AND pid <> pg_backend_pid() AND datname = current_database()"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with postgres_cluster(PG_BIN) as url:
        yield url


@pytest.fixture
def two_nodes(cluster: str) -> Iterator[tuple]:
    """Two processes' session factories over one fresh database."""
    url = create_database(cluster)
    upgrade(url)
    engines = [make_engine(url), make_engine(url)]
    yield tuple(session_factory(engine) for engine in engines)
    for engine in engines:
        engine.dispose()


def test_a_message_being_sent_by_one_deliverer_is_skipped_by_another(two_nodes) -> None:
    first, second = two_nodes
    sending, release = threading.Event(), threading.Event()

    def slow_send(notifier, message, now):
        sending.set()
        assert release.wait(10)
        return deliver_local(notifier, message, now)

    with ChatServer() as chat:
        queue(first, chat.url)
        counts: dict[str, int] = {}
        worker = threading.Thread(target=lambda: counts.update(deliver_due(first, now=T0, send=slow_send)))
        worker.start()
        try:
            assert sending.wait(10)
            # The first deliverer is mid-send, its row locked: the second skips it, sending nothing.
            assert deliver_due(second, now=T0, send=deliver_local) == {"sent": 0, "retrying": 0, "failed": 0}
        finally:
            release.set()
            worker.join(10)
        assert counts == {"sent": 1, "retrying": 0, "failed": 0}
        later = T0 + timedelta(hours=1)
        assert deliver_due(second, now=later, send=deliver_local) == {"sent": 0, "retrying": 0, "failed": 0}
    assert len(chat.received) == 1
    with second() as s:
        assert (s.scalars(select(OutboxMessage)).one().state, len(chat.received)) == ("sent", 1)


def test_a_deliverer_whose_connection_dies_mid_send_leaves_the_message_to_the_next(two_nodes) -> None:
    first, second = two_nodes
    killed: list[bool] = []

    def dying_send(notifier, message, now):
        # As when the process is SIGKILLed: the server ends its connection, the attempt uncommitted.
        with second() as s, s.begin():
            killed.extend(s.scalars(text(KILL_LOCK_HOLDER)))
        raise ConnectionResetError("killed")

    with ChatServer() as chat:
        queue(first, chat.url)
        with pytest.raises(OperationalError, match="terminating connection"):  # its rollback found no connection
            deliver_due(first, now=T0, send=dying_send)
        assert killed == [True]
        assert deliver_due(second, now=T0, send=deliver_local) == {"sent": 1, "retrying": 0, "failed": 0}
    assert len(chat.received) == 1
