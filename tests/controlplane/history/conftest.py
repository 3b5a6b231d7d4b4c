"""Synthetic history rows with known contents, over a real migrated SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from controlplane.models import SlotSample
from serving.histogram import Histogram

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def slot_row(
    ts: datetime,
    latencies,
    *,
    errors=0,
    client_errors=0,
    timeouts=0,
    rejections=0,
    process="p1",
    version="1",
    slot="blue",
    model="textcls",
    batches=None,
    tokens=(0, 0),
    queue=(0, 0.0),
    interval=10.0,
) -> SlotSample:
    """Build a raw row as the sampler would, from the latencies of the requests that ran."""
    h = Histogram()
    for v in latencies:
        h.record(float(v))
    sizes = batches or ({"1": len(latencies)} if len(latencies) else {})
    return SlotSample(
        ts=ts,
        resolution_s=0,
        interval_s=interval,
        process=process,
        model=model,
        version=version,
        slot=slot,
        successes=len(latencies) - errors - client_errors,
        errors=errors,
        client_errors=client_errors,
        timeouts=timeouts,
        rejections=rejections,
        latency_hist=h.to_dict(),
        latency_sum_s=float(np.sum(latencies)) if len(latencies) else 0.0,
        queue_depth_max=queue[0],
        queue_depth_mean=queue[1],
        batches=sum(sizes.values()),
        batch_sizes=sizes,
        real_tokens=tokens[0],
        padded_tokens=tokens[1],
    )


def latencies(seed: int, n: int, median_s: float = 0.01) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(np.log(median_s), 0.6, n)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


@pytest.fixture(scope="module")
def pg_sessions() -> Iterator:
    """Sessions on a migrated database of a throwaway PostgreSQL cluster; skips without psycopg or PostgreSQL."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
    from controlplane.db import make_engine, session_factory
    from controlplane.migrate import upgrade
    from tests.pg import create_database, find_bindir, postgres_cluster

    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    with postgres_cluster(bindir) as cluster:
        url = create_database(cluster)
        upgrade(url)
        engine = make_engine(url)
        yield session_factory(engine)
        engine.dispose()
