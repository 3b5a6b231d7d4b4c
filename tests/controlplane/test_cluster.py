"""Several nodes, seen by an operator: live and gone processes, who leads, which node answered.

The liveness rules run on a real SQLite database at explicit times (no waiting); the views run in
the in-process app, whose reconciler writes its real heartbeat.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from controlplane import metrics
from controlplane.auth import Role
from controlplane.cluster import Liveness, describe_cluster, drop_gone_processes
from controlplane.models import EngineStatus, Lease, SlotStatus
from controlplane.rollout.readmodel import describe_deployment
from controlplane.scheduler import LeaderScheduler
from tests.controlplane.conftest import token_for

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
LIVENESS = Liveness(heartbeat_s=2.0, drop_after_s=60.0)  # gone after 6 s of silence, dropped after 60 s


def report(session, process: str, beat: datetime | None, version: str = "1") -> None:
    """What a serving process writes: its slot report and (unless None) its heartbeat."""
    session.merge(SlotStatus(process=process, model="mlp", slot="blue", version=version, state="loaded",
                             error="", generation=1, updated_at=T0))  # fmt: skip
    if beat is not None:
        session.merge(EngineStatus(process=process, generation=1, compact_generation=0, error="", report=None,
                                   updated_at=beat, started_at=T0, software_version="0.1.0"))  # fmt: skip


@pytest.fixture
def sessions(app):
    return app.extensions["flightdeck"].sessions


def test_a_silent_process_is_shown_gone_then_dropped_and_a_live_one_stays(app, sessions) -> None:
    app.extensions["flightdeck"].reconciler.stop()  # this process's own reports would only add noise
    with sessions() as s:
        report(s, "node-a:11", T0)
        report(s, "node-b:22", T0 - timedelta(seconds=5))  # its last heartbeat, 5 s before T0
        report(s, "node-c:33", None)  # a process that never sent one (or whose row went)
        s.commit()

        def states(now: datetime) -> dict[str, str]:
            found = describe_deployment(s, "mlp", LIVENESS, now)
            return {p["process"]: p["state"] for p in found["processes"]}

        assert states(T0) == {"node-a:11": "loaded", "node-b:22": "loaded", "node-c:33": "gone"}
        # node-b's 6 s of silence are over one second later; node-a's only at T0 + 6 s.
        assert states(T0 + timedelta(seconds=1.5)) == {"node-a:11": "loaded", "node-b:22": "gone", "node-c:33": "gone"}
        assert states(T0 + timedelta(seconds=6.5))["node-a:11"] == "gone"
        gone = describe_deployment(s, "mlp", LIVENESS, T0 + timedelta(seconds=1.5))["processes"][1]
        assert (gone["alive"], gone["reported_state"], gone["version"]) == (False, "loaded", "1")

        cluster = describe_cluster(s, T0 + timedelta(seconds=1.5), LIVENESS)
        assert [(n["node"], n["alive"]) for n in cluster["nodes"]] == [
            ("node-a", True), ("node-b", False), ("node-c", False)
        ]  # fmt: skip
        a = cluster["nodes"][0]["processes"][0]
        assert (a["pid"], a["state"], a["flightdeck_version"], a["serving"]) == (
            11, "alive", "0.1.0", [{"model": "mlp", "slot": "blue", "version": "1", "state": "loaded"}]
        )  # fmt: skip

        assert drop_gone_processes(s, T0 + timedelta(seconds=54), LIVENESS) == []  # gone, but still listed
        report(s, "node-a:11", T0 + timedelta(seconds=58))  # node-a keeps beating
        assert drop_gone_processes(s, T0 + timedelta(seconds=61), LIVENESS) == ["node-b:22", "node-c:33"]
        s.commit()
        assert (
            set(s.scalars(select(SlotStatus.process))) == set(s.scalars(select(EngineStatus.process))) == {"node-a:11"}
        )


def test_the_cluster_view_names_the_leader_since_its_takeover_and_the_answering_node(app, client) -> None:
    services = app.extensions["flightdeck"]
    me = services.reconciler.process
    viewer = token_for(app, "vic", Role.VIEWER)
    answer = client.get("/api/cluster", headers=viewer)
    body = answer.get_json()
    assert answer.status_code == 200 and body["leader"] is None  # no scheduler in this app: nobody leads
    assert answer.headers["X-Flightdeck-Node"] == services.settings.node_name == body["node"]
    (node,) = body["nodes"]
    (process,) = node["processes"]
    assert (process["process"], process["alive"], process["leader"]) == (me, True, False)
    assert {(s["model"], s["version"]) for s in process["serving"]} == {("mlp", "1"), ("textcls", "1")}

    scheduler = LeaderScheduler(services.sessions, ttl_s=30, process=me)
    try:
        assert scheduler.renew()
        body = client.get("/api/cluster", headers=viewer).get_json()
        with services.sessions() as s:
            since = s.get(Lease, "scheduler").acquired_at
        assert body["leader"]["process"] == me and body["leader"]["current"]
        assert body["leader"]["since"] == since.isoformat() and body["nodes"][0]["processes"][0]["leader"]
        assert scheduler.renew()  # a renewal: "since" stays
        assert client.get("/api/cluster", headers=viewer).get_json()["leader"]["since"] == since.isoformat()
    finally:
        scheduler.shutdown()
    assert client.get("/api/cluster", headers=viewer).get_json()["leader"]["current"] is False  # released


def test_the_cluster_view_needs_a_viewer_where_reads_need_one(app_config, home) -> None:
    from controlplane.app import create_app

    application = create_app({**app_config, "auth_reads": True})
    try:
        client = application.test_client()
        assert client.get("/api/cluster").status_code == 401
        assert client.get("/api/cluster", headers=token_for(application, "vic", Role.VIEWER)).status_code == 200
    finally:
        application.extensions["flightdeck"].shutdown(5)


def test_every_answer_names_its_node_and_the_engine_view_says_which_process(app, client) -> None:
    services = app.extensions["flightdeck"]
    engine = client.get("/api/engine")
    assert engine.get_json()["node"] == services.settings.node_name == engine.headers["X-Flightdeck-Node"]
    assert engine.get_json()["process"] == services.reconciler.process
    assert client.get("/api/nothing-here").headers["X-Flightdeck-Node"] == services.settings.node_name


def test_a_stopping_process_takes_its_reports_with_it(app) -> None:
    services = app.extensions["flightdeck"]
    me = services.reconciler.process
    with services.sessions() as s:
        assert me in set(s.scalars(select(SlotStatus.process)))
    services.reconciler.stop()
    with services.sessions() as s:
        assert me not in set(s.scalars(select(SlotStatus.process)))
        assert s.get(EngineStatus, me) is None


def test_metrics_say_whether_this_node_leads(app, client) -> None:
    services = app.extensions["flightdeck"]
    scheduler = LeaderScheduler(
        services.sessions, ttl_s=30, process=services.reconciler.process,
        on_renewed=lambda leads: metrics.LEADER.set(int(leads)),
    )  # fmt: skip
    try:
        scheduler.renew()
        text = client.get("/metrics").get_data(as_text=True)
        assert re.search(r'^flightdeck_leader\{node="[^"]+"\} 1\.0$', text, re.M), text[:2000]
    finally:
        scheduler.shutdown()
    text = client.get("/metrics").get_data(as_text=True)
    assert re.search(r'^flightdeck_leader\{node="[^"]+"\} 0\.0$', text, re.M)


def test_the_heartbeat_has_a_timer_of_its_own_so_a_long_pass_does_not_make_a_process_look_gone(app) -> None:
    services = app.extensions["flightdeck"]
    me = services.reconciler.process
    with services.sessions() as s:
        first = s.get(EngineStatus, me).updated_at
    services.reconciler.beat()  # what the scheduler's `heartbeat` job runs, while a pass may be loading a model
    with services.sessions() as s:
        assert s.get(EngineStatus, me).updated_at > first
