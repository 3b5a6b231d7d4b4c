"""Two serving processes over one SQLite file: a load that failed in one is tried again on a new deploy.

Two engines with their own reconcilers stand for two gunicorn workers (or nodes); passes are run
by hand, so the test sees each process's state after each step. Automatic moves are audited.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from controlplane.config import load_settings
from controlplane.models import AuditEvent, Rollout
from controlplane.rollout import controller, service
from controlplane.rollout.audit import system_audit
from controlplane.rollout.deployments import first_deploy
from controlplane.rollout.reconciler import Reconciler
from controlplane.rollout.service import RolloutSettings
from controlplane.scheduler import utcnow
from serving.engine import Engine


class FlakyStore:
    """Locates versions in the demo store, except that the first `failures` lookups of `version` fail."""

    def __init__(self, store: Path, version: str, failures: int) -> None:
        self.store, self.version, self.failures, self.calls = store, version, failures, 0

    def __call__(self, model: str, version: str) -> Path:
        if version == self.version:
            self.calls += 1
            if self.calls <= self.failures:
                raise OSError(f"disk hiccup reading {model} {version}")
        return self.store / model / version


def _engine(home: Path) -> Engine:
    settings = load_settings(environ={}, overrides={"home": str(home)})
    return Engine(settings.runtime, settings.batching_settings)


def test_a_version_that_failed_in_one_process_loads_there_on_the_next_deploy(sessions, tmp_path, demo_store) -> None:
    engines = [_engine(tmp_path), _engine(tmp_path)]
    flaky = FlakyStore(demo_store, "2", failures=1)
    reconcilers = [
        Reconciler(engines[0], sessions, lambda m, v: demo_store / m / v, "node-a:1"),
        Reconciler(engines[1], sessions, flaky, "node-b:1"),
    ]

    def converge() -> None:
        for r in reconcilers:
            r.reconcile()

    def tick() -> list[str]:
        with sessions() as s, s.begin():
            return controller.tick(s, system_audit, RolloutSettings(scale_down_delay_s=3600))

    def deploy() -> int:
        with sessions() as s, s.begin():
            return service.deploy(s, "mlp", "2", "otto", system_audit, steps=[50, 100], pause_s=3600).id

    try:
        with sessions() as s, s.begin():
            first_deploy(s, "mlp", "1", system_audit)
        converge()
        first = deploy()
        converge()  # node-b's disk hiccups: it reports v2 failed
        assert tick() == [f"{first}: rolled back: could not load mlp version 2 into green: disk hiccup reading mlp 2"]
        converge()
        assert [v.spec.version for v in engines[0].loaded("mlp")] == ["1"]  # node-a took v2 out again

        second = deploy()  # the same version, asked again, through no particular process
        converge()
        assert flaky.calls == 2  # tried again on node-b, which did not answer the deploy call
        assert tick() == [f"{second}: loaded -> progressing"]
        converge()
        for engine in engines:
            assert engine.weights("mlp") == {"blue": 50, "green": 50}
            assert sorted(v.spec.version for v in engine.loaded("mlp")) == ["1", "2"]
        converge()  # a pass with nothing new retries nothing
        assert flaky.calls == 2

        with sessions() as s:
            events = [(e.actor, e.action, e.detail) for e in s.scalars(select(AuditEvent).order_by(AuditEvent.id))]
            assert s.get(Rollout, second).state == "progressing"
        automatic = [
            (action, detail["rollout"], detail["verdict"])
            for actor, action, detail in events
            if actor == "system" and action.startswith("rollout.auto")
        ]
        assert automatic == [
            ("rollout.auto_rollback", first, "load_failed"),
            ("rollout.auto_promote", second, "loaded"),
        ]
    finally:
        for engine in engines:
            for loaded in engine.loaded():
                engine.unload(loaded.spec.name, loaded.slot)


def test_a_load_that_failed_is_not_retried_by_a_pass_for_the_same_desired_state(sessions, tmp_path, demo_store) -> None:
    engine = _engine(tmp_path)
    flaky = FlakyStore(demo_store, "1", failures=5)
    reconciler = Reconciler(engine, sessions, flaky, "node-a:1")
    try:
        with sessions() as s, s.begin():
            first_deploy(s, "mlp", "1", system_audit)
        reconciler.reconcile()
        reconciler._applied.clear()  # as after a pass that raised half-way: the same desired state again
        reconciler.reconcile()
        assert flaky.calls == 1 and engine.loaded("mlp") == []
    finally:
        for loaded in engine.loaded():
            engine.unload(loaded.spec.name, loaded.slot)


def test_automatic_promotions_pauses_rollbacks_and_scale_downs_are_audited_with_their_verdict(
    sessions, tmp_path, demo_store
) -> None:
    engine = _engine(tmp_path)
    reconciler = Reconciler(engine, sessions, lambda m, v: demo_store / m / v, "node-a:1")
    now = utcnow()

    def tick(at) -> list[str]:
        with sessions() as s, s.begin():
            return controller.tick(s, system_audit, RolloutSettings(scale_down_delay_s=60, history_interval_s=1), at)

    try:
        with sessions() as s, s.begin():
            first_deploy(s, "mlp", "1", system_audit, now)
        reconciler.reconcile()
        with sessions() as s, s.begin():
            rollout = service.deploy(s, "mlp", "2", "otto", system_audit, steps=[100], pause_s=0,
                                     policy={"min_requests": 0}, now=now).id  # fmt: skip
        reconciler.reconcile()
        assert tick(now) == [f"{rollout}: loaded -> succeeded"]  # one step of 100 %: at once the whole way
        later = now + timedelta(seconds=120)
        assert tick(later) == ["mlp: scaled down 1 from blue"]
        with sessions() as s:
            events = [
                (e.actor, e.action, e.target, e.detail) for e in s.scalars(select(AuditEvent).order_by(AuditEvent.id))
            ]
        actor, action, target, detail = events[-1]
        assert (actor, action, target) == ("system", "deployment.scale_down", "mlp:1")
        assert detail["verdict"] == "idle" and "past the scale-down delay of 60 s" in detail["reason"]
        promote = next(e for e in events if e[1] == "rollout.auto_promote")
        assert promote[0] == "system" and promote[3]["traffic_percent"] == 100
    finally:
        for loaded in engine.loaded():
            engine.unload(loaded.spec.name, loaded.slot)
