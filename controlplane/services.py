"""The composition root: builds the engine, the database and the scheduler, and wires them.

Everything else receives these as arguments (or through app.extensions["flightdeck"]).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

from sqlalchemy import Engine as DbEngine
from sqlalchemy.orm import Session, sessionmaker

from controlplane import metrics
from controlplane.config import Settings
from controlplane.db import make_engine, session_factory
from controlplane.history.retention import apply_retention
from controlplane.history.sampler import HistorySampler
from controlplane.history.service import HistoryService
from controlplane.modelstore import prepare_home, startup_versions
from controlplane.scheduler import LeaderScheduler, utcnow
from serving.engine import Engine
from serving.runtime import check_single_distribution

log = logging.getLogger(__name__)


@dataclass
class Services:
    """Everything a request handler or CLI command needs, built once per process."""

    settings: Settings
    engine: Engine
    db: DbEngine
    sessions: sessionmaker[Session]
    scheduler: LeaderScheduler | None
    history: HistoryService
    sampler: HistorySampler

    def refresh_gauges(self) -> None:
        """Publish readiness, traffic weights and GPU readings (called before each scrape)."""
        metrics.ENGINE_READY.set(1 if self.engine.ready() else 0)
        for name in self.engine.models():
            for slot, weight in self.engine.weights(name).items():
                metrics.TRAFFIC_WEIGHT.labels(name, slot).set(weight)
        metrics.update_gpu_gauges()

    def shutdown(self, grace_s: float | None = None) -> bool:
        """Drain the engine, stop the scheduler, write the last history rows, close the database."""
        drained = self.engine.drain(grace_s)
        metrics.ENGINE_READY.set(0)
        if self.scheduler is not None:
            self.scheduler.shutdown()
            try:
                self.sampler.sample()  # what happened since the last interval is not lost
            except Exception:
                log.exception("final history sample failed")
        self.db.dispose()
        return drained


def _retention(sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as session:
        apply_retention(session, utcnow(), settings.retention)


def build_services(settings: Settings, *, start_scheduler: bool | None = None) -> Services:
    """Build and start every long-lived part of one serving process."""
    check_single_distribution()
    prepare_home(settings)
    engine = Engine(settings.runtime, settings.batching_settings, observer_factory=metrics.SlotMetrics)
    for name, version_dir in startup_versions(settings.model_store, settings.load_models).items():
        loaded = engine.load(version_dir, "blue")
        metrics.MODEL_INFO.labels(name, loaded.spec.version, "blue", loaded.provider).set(1)
    db = make_engine(settings.sqlalchemy_url)
    sessions = session_factory(db)
    sampler = HistorySampler(engine, sessions, process=f"{socket.gethostname()}:{os.getpid()}")
    scheduler = None
    if settings.scheduler if start_scheduler is None else start_scheduler:
        scheduler = LeaderScheduler(sessions, settings.lease_ttl_s)
        scheduler.add_local_job(sampler.sample, settings.history_interval_s, "history-sample")
        scheduler.add_cluster_job(
            lambda: _retention(sessions, settings), settings.retention_interval_s, "history-retention"
        )
        scheduler.start()
    services = Services(settings, engine, db, sessions, scheduler, HistoryService(sessions), sampler)
    services.refresh_gauges()
    return services
