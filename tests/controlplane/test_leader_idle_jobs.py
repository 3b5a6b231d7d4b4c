"""The leader's frequent jobs while there is nothing to do: one read each, and never a missed step.

The rollout tick (every second), the runbook sweep (every 2 s) and the outbox (every 5 s) found nothing to
do on an idle server, each in a transaction or two of ORM reads: together a fifth of the leader's idle
CPU. Each now asks one small question first, without a session (`controlplane.quickread`). What must
hold: every state the rollout tick acts on says there is work (a rollout loading, progressing or paused;
an old version in the idle slot, whose scale-down comes with no rollout in flight).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event

from controlplane.alerting.outbox import deliver_due
from controlplane.models import Deployment
from controlplane.rollout.controller import has_work, may_have_work
from tests.controlplane.rollout.test_rollouts import advance, deploy, settle


@pytest.fixture
def app_config(app_config: dict) -> dict:
    return app_config | {"scale_down_delay_s": 600.0}


def _has_work(app) -> bool:
    """`has_work` in a session, and asked the quick way (`may_have_work`), which must agree."""
    sessions = app.extensions["flightdeck"].sessions
    with sessions() as session:
        answer = has_work(session)
    assert may_have_work(sessions) == answer
    return answer


def _statements_of(app, call) -> tuple[object, list[str]]:
    db, seen = app.extensions["flightdeck"].db, []

    def record(_conn, _cursor, statement, *_args) -> None:
        seen.append(statement)

    event.listen(db, "before_cursor_execute", record)
    try:
        return call(), seen
    finally:
        event.remove(db, "before_cursor_execute", record)


def test_with_nothing_to_do_each_frequent_leader_job_opens_no_session(app) -> None:
    services = app.extensions["flightdeck"]
    assert not _has_work(app)
    jobs = {
        "rollout tick": (services.advance_rollouts, []),
        "runbook sweep": (services.runbooks.sweep, {"expired": 0, "started": 0}),
        "outbox": (lambda: deliver_due(services.sessions), {"sent": 0, "retrying": 0, "failed": 0}),
    }
    for name, (job, nothing) in jobs.items():
        result, statements = _statements_of(app, job)
        assert result == nothing and statements == [], (name, statements)  # asked through quickread


def test_every_state_the_tick_acts_on_has_work_through_to_the_scale_down(app, client, operator) -> None:
    services = app.extensions["flightdeck"]
    held = deploy(client, operator, version="2", steps=[50, 100], pause_s=3600)
    assert _has_work(app)  # loading
    settle(app)
    assert advance(app) == [f"{held['id']}: loaded -> progressing"]
    assert _has_work(app)  # progressing, its step held for an hour
    response = client.post(f"/api/rollouts/{held['id']}/pause", headers=operator)
    assert response.status_code == 200 and _has_work(app)  # paused
    response = client.post(f"/api/rollouts/{held['id']}/promote", headers=operator)  # from paused: all the way
    assert response.get_json()["state"] == "succeeded", response.get_json()
    settle(app)
    # No rollout in flight, but version 1 waits in blue for its scale-down: the tick must still run.
    assert _has_work(app)
    assert advance(app) == []  # not yet: the delay is 10 minutes
    with services.sessions() as session, session.begin():
        deployment = session.get(Deployment, "mlp")
        deployment.updated_at -= timedelta(hours=1)  # as if the rollout had ended an hour ago
    assert advance(app) == ["mlp: scaled down 1 from blue"]
    assert not _has_work(app)
