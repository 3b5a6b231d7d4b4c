"""The composition root: builds the engine, the database and the scheduler, and wires them.

Everything else receives these as arguments, or in a request through `context.current_services()`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine as DbEngine
from sqlalchemy.orm import Session, sessionmaker

from alerts.notifiers.delivery import deliver
from alerts.slo import SLO
from controlplane import metrics, tracing
from controlplane.alerting.evaluator import AlertEvaluator
from controlplane.alerting.outbox import deliver_due
from controlplane.alerting.secretbox import Keyring
from controlplane.clock import utcnow
from controlplane.cluster import drop_gone_processes
from controlplane.config import Settings
from controlplane.db import make_engine, session_factory
from controlplane.history.sampler import HistorySampler
from controlplane.history.service import HistoryService
from controlplane.jobprocess import JobProcess
from controlplane.modelstore import prepare_store
from controlplane.registry.service import Registry
from controlplane.rollout.audit import system_audit
from controlplane.rollout.controller import may_have_work, tick
from controlplane.rollout.reconciler import Reconciler
from controlplane.runbooks.runner import RunbookRunner, build_runner
from controlplane.scheduler import LeaderScheduler
from controlplane.windowjobs import WindowJobs, build_evaluator, load_alert_rules
from controlplane.windowjobs import publish as publish_window_result
from serving.cores import CoreClaim
from serving.engine import Engine
from serving.measured import Measurements
from serving.memory import trim_heap
from serving.runtime import check_single_distribution

log = logging.getLogger(__name__)
# How often each process gives its free C heap back (serving.memory.trim_heap, glibc's malloc_trim). A mitigation
# (issue 29, item 8): glibc keeps freed heap in each thread's arena; under steady load the lease holder's RSS grew
# with the bytes in use flat. It lowers the level, not the slope (SECURITY.md, "Memory over a long run").
HEAP_TRIM_S = 60.0


@dataclass(kw_only=True)
class Services:
    """Everything a request handler or CLI command needs, built once per process."""

    settings: Settings
    engine: Engine
    db: DbEngine
    sessions: sessionmaker[Session]
    scheduler: LeaderScheduler | None
    history: HistoryService
    sampler: HistorySampler
    reconciler: Reconciler
    locate: Callable[[str, str], Path]
    registry: Registry
    alerts: AlertEvaluator
    runbooks: RunbookRunner
    serving_gauges: metrics.ServingGauges
    slos: list[SLO]
    receiver_keys: Keyring  # encrypt and open receivers' secrets (HOME/secret.key or FLIGHTDECK_SECRET_KEYS)
    tracing: tracing.Tracing | None = None  # OpenTelemetry traces: None unless OTEL_* names an OTLP endpoint
    job_process: JobProcess | None = None  # the leader's window jobs, when they run out of process

    def refresh_gauges(self) -> None:
        """Publish readiness, what is served, traffic weights and GPU readings (called before each scrape)."""
        metrics.ENGINE_READY.set(1 if self.engine.ready() else 0)
        self.serving_gauges.publish()
        metrics.update_gpu_gauges()

    def advance_rollouts(self) -> list[str]:
        """Run one rollout-controller step (the leader's job), then wake this process's reconciler."""
        if not may_have_work(self.sessions):
            return []
        with self.sessions() as session, session.begin():
            events = tick(session, system_audit, self.settings.rollout)
        for event in events:
            log.info("rollout %s", event)
        if events:
            self.reconciler.wake()
        return events

    def shutdown(self, grace_s: float | None = None) -> bool:
        """Drain the engine, stop the scheduler, write the last history rows, close the database."""
        self.runbooks.shutdown()
        self.reconciler.stop()
        drained = self.engine.drain(grace_s)
        metrics.ENGINE_READY.set(0)
        if self.scheduler is not None:
            self.scheduler.shutdown()
            if self.job_process is not None:  # one exists only beside a scheduler
                self.job_process.close()
            try:
                self.sampler.sample()  # what happened since the last interval is not lost
            except Exception:
                log.exception("final history sample failed")
        self.db.dispose()
        if self.tracing is not None:
            self.tracing.shutdown()  # the last spans exported
        return drained


def _drop_gone_processes(sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as session:
        gone = drop_gone_processes(session, utcnow(), settings.liveness)
        session.commit()
    if gone:
        log.info("dropped the reports of %d process(es) silent for %g s: %s", len(gone), settings.process_drop_s, gone)


def build_services(settings: Settings, *, start_scheduler: bool | None = None) -> Services:
    """Build and start every long-lived part of one serving process."""
    check_single_distribution()
    # NOTE: built here, in each serving process after gunicorn's fork: the span exporter's thread is its own.
    traces = tracing.configure(settings.node_name)
    engine = Engine(
        settings.runtime,
        settings.batching_settings,
        observer_factory=metrics.SlotMetrics,
        tracer_factory=None if traces is None else traces.batch_tracer,
        cores=CoreClaim(settings.home / "cores.lock"),  # the workers of a node share it: one lone run at a time
        measured=Measurements(settings.measurements_dir),  # ... and what their loads timed: one cost curve
    )
    db = make_engine(settings.sqlalchemy_url)
    sessions = session_factory(db)
    # NOTE: under gunicorn the master's `prepare` child already did this, so each worker finds nothing to do.
    prepare_store(settings, sessions)
    process = f"{settings.node_name}:{os.getpid()}"  # NODE:PID: the history and status rows group by node

    # NOTE: one registry (and so one S3 client and cache) for every load this process makes.
    registry = Registry.for_settings(sessions, settings)
    log.info("model versions are stored in %s", registry.storage.describe())

    def locate(name: str, version: str) -> Path:
        return registry.folder(registry.get(name, version))

    serving_gauges = metrics.ServingGauges(engine)
    sampler = HistorySampler(engine, sessions, process=process)
    reconciler = Reconciler(
        engine,
        sessions,
        locate,
        process,
        poll_s=settings.reconcile_poll_ms / 1000,
        # The served set is the deployments table; this node may take part of it.
        models=set(settings.served_models) or None,
        on_changed=serving_gauges.publish,
        safety_poll_s=settings.reconcile_safety_poll_s,
        # A rollout step is judged on history rows that begin once its traffic split took effect.
        on_traffic_moved=sampler.sample,
        heartbeat_s=settings.heartbeat_s,
    )
    reconciler.start()  # the first pass is synchronous: the models are loaded before the app serves
    runbooks = build_runner(settings, sessions)
    rules, slos = load_alert_rules(settings)
    evaluator = build_evaluator(settings, sessions, rules, runbooks, engine.ready)
    window_jobs = WindowJobs(settings, sessions, evaluator)
    scheduling = settings.scheduler if start_scheduler is None else start_scheduler
    job_process = JobProcess(settings) if settings.job_process and scheduling else None

    def window_job(job: str) -> Callable[[], None]:
        def run() -> None:
            if job_process is None:
                result = window_jobs.run(job)
            else:
                result = job_process.run(job, engine_ready=engine.ready())
            publish_window_result(job, result)

        return run

    services = Services(
        settings=settings,
        engine=engine,
        db=db,
        sessions=sessions,
        scheduler=None,
        history=HistoryService(sessions),
        sampler=sampler,
        reconciler=reconciler,
        locate=locate,
        registry=registry,
        alerts=evaluator,
        runbooks=runbooks,
        serving_gauges=serving_gauges,
        slos=slos,
        receiver_keys=Keyring.for_settings(settings),
        tracing=traces,
        job_process=job_process,
    )
    if scheduling:
        scheduler = LeaderScheduler(
            sessions, settings.lease_ttl_s, process=process, on_renewed=functools.partial(_renewed, job_process)
        )
        scheduler.add_local_job(sampler.sample, settings.history_interval_s, "history-sample")
        scheduler.add_local_job(reconciler.beat, settings.heartbeat_s, "heartbeat")  # alive even mid-load
        scheduler.add_cluster_job(window_job("history-retention"), settings.retention_interval_s, "history-retention")
        scheduler.add_cluster_job(services.advance_rollouts, settings.rollout_tick_s, "rollout-controller")
        scheduler.add_cluster_job(window_job("alert-evaluator"), settings.alert_interval_s, "alert-evaluator")
        scheduler.add_cluster_job(window_job("drift-score"), settings.drift_interval_s, "drift-score")
        delivery = functools.partial(deliver, targets=settings.receiver_targets)  # RECEIVER_ALLOW at every send
        scheduler.add_cluster_job(
            lambda: deliver_due(
                sessions, backoff_s=settings.outbox_backoff_s, send=delivery, keys=services.receiver_keys
            ),
            settings.outbox_interval_s,
            "alert-outbox",
        )
        scheduler.add_cluster_job(runbooks.sweep, 2.0, "runbook-sweeper")
        scheduler.add_cluster_job(
            lambda: _drop_gone_processes(sessions, settings), settings.heartbeat_s, "process-sweeper"
        )
        # Every node, not only the leader: each has its own cache (a no-op on the local disk).
        scheduler.add_local_job(registry.prune_copies, settings.cache_prune_s, "cache-prune")
        # Every process: the leader's jobs free the most, but the serving threads' heap fragments too.
        scheduler.add_local_job(trim_heap, HEAP_TRIM_S, "heap-trim")
        scheduler.start()
        services.scheduler = scheduler
    services.refresh_gauges()
    return services


def _renewed(job_process: JobProcess | None, leads: bool) -> None:
    """After each lease renewal: the leader gauge, and a worker that no longer leads stops its job process."""
    metrics.LEADER.set(int(leads))
    if not leads and job_process is not None:
        job_process.release()
