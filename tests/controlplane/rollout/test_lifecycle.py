"""Every rollout state change the controller and people's actions make goes through the one writer.

`StateWrites` sees each assignment of `Rollout.state` (a SQLAlchemy attribute event) beside each change
`rollout.lifecycle` logged; the walk below takes real rollouts (real engine, SQLite, history) down
every path the code has, and the two lists must match, each change must be in the transition table,
and together the paths must use the whole table: no event the code never fires.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import event, select

from controlplane.models import Rollout
from controlplane.rollout import service
from controlplane.rollout.audit import system_audit
from controlplane.rollout.states import INITIAL, RolloutState, transitions
from tests.controlplane.rollout.test_rollouts import advance, deploy, settle, versions_served


class StateWrites(logging.Handler):
    """Record every write of `Rollout.state` and every change the one writer (`rollout.lifecycle`) made."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.written: list[tuple[str | None, str]] = []  # (before, after) of each assignment
        self.changes: list[tuple[str | None, str, str]] = []  # (before, event, after) as the writer logged it
        self._listener = self._written  # NOTE: one bound method, so event.remove finds what was listened

    def _written(self, target: Rollout, value: str, old: object, initiator: object) -> None:
        self.written.append((old if isinstance(old, str) else None, str(value)))

    def emit(self, record: logging.LogRecord) -> None:
        change = getattr(record, "rollout_transition", None)
        if change is not None:
            self.changes.append(change)

    def __enter__(self) -> StateWrites:
        event.listen(Rollout.state, "set", self._listener, active_history=True)
        logger = logging.getLogger("controlplane.rollout.lifecycle")
        self._level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(Rollout.state, "set", self._listener)
        logger = logging.getLogger("controlplane.rollout.lifecycle")
        logger.removeHandler(self)
        logger.setLevel(self._level)

    def problems(self) -> list[str]:
        """Say what was written outside the writer, or against the table; empty when all is well."""
        found = []
        by_writer = [(before, after) for before, _, after in self.changes]
        if by_writer != self.written:
            found.append(f"state written outside rollout.lifecycle: writes {self.written}, changes {by_writer}")
        table = transitions()
        for before, name, after in self.changes:
            legal = (before, after) == (None, INITIAL) if name == "start" else table.get((before, name)) == after
            if not legal:
                found.append(f"{before} --{name}--> {after} is not in the transition table")
        return found

    def fired(self) -> set[tuple[RolloutState, str]]:
        """Return the (state, event) pairs of the table that happened."""
        return {(RolloutState(before), name) for before, name, _ in self.changes if name != "start"}


@pytest.fixture
def app_config(app_config: dict) -> dict:
    """Old stable versions are scaled down in the controller step that ends a rollout (a rollback must reload)."""
    return app_config | {"scale_down_delay_s": 0.0}


@pytest.fixture
def writes() -> Iterator[StateWrites]:
    with StateWrites() as recorder:
        yield recorder


def state_of(app, rollout_id: int) -> str:
    with app.extensions["flightdeck"].sessions() as session:
        return session.get(Rollout, rollout_id).state


def act(client, operator, rollout_id: int, action: str) -> dict:
    response = client.post(f"/api/rollouts/{rollout_id}/{action}", headers=operator)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def not_stable(client) -> str:
    """Return the demo version that is not mlp's stable one: what the next rollout moves to."""
    deployment = client.get("/api/models/mlp/deployment").get_json()
    return "1" if deployment["slots"][deployment["stable_slot"]]["version"] == "2" else "2"


def rollback(client, operator) -> dict:
    response = client.post("/api/models/mlp/rollback", headers=operator)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def test_every_path_of_the_controller_and_the_actions_is_a_legal_transition(app, client, operator, writes) -> None:
    quick = {"pause_s": 0, "policy": {"min_requests": 0}}  # every step passes its analysis at once
    stuck = {"pause_s": 0, "policy": {"min_requests": 1000}}  # every analysis is inconclusive
    held = {"steps": [50, 100], "pause_s": 3600}  # the controller never analyses it

    # Loading: aborted, rolled back, failing to load.
    r = deploy(client, operator, version="2", **held)
    assert act(client, operator, r["id"], "abort")["state"] == "aborted"
    r = deploy(client, operator, version="2", **held)
    assert rollback(client, operator)["rollout"] == r["id"] and state_of(app, r["id"]) == "rolled_back"
    with app.extensions["flightdeck"].sessions() as session, session.begin():
        missing = service.deploy(session, "mlp", "9", "otto", system_audit, pause_s=0).id  # not in the registry
    settle(app)
    (rolled_back,) = advance(app)
    assert rolled_back.startswith(f"{missing}: rolled back: could not load mlp version 9 into green")

    # A canary through every step move: analysis, pause, resume, promote from progressing and from paused.
    r = deploy(client, operator, version="2", steps=[10, 20, 30, 40, 50, 100], **quick)
    settle(app)
    assert advance(app) == [f"{r['id']}: loaded -> progressing"]
    assert act(client, operator, r["id"], "pause")["state"] == "paused"
    assert act(client, operator, r["id"], "resume")["state"] == "progressing"
    assert advance(app) == [f"{r['id']}: pass -> progressing"]
    assert act(client, operator, r["id"], "promote")["traffic_percent"] == 30
    assert act(client, operator, r["id"], "pause")["state"] == "paused"
    promoted = act(client, operator, r["id"], "promote")
    assert (promoted["state"], promoted["traffic_percent"]) == ("progressing", 40)
    settle(app)  # a step is judged on rows that begin once its split took effect: there are none before
    assert advance(app) == [f"{r['id']}: pass -> progressing"]
    assert advance(app)[0] == f"{r['id']}: pass -> succeeded"  # v1 scaled down in the same step

    # A rollback that must reload the previous version first, then a blue-green deploy.
    back = rollback(client, operator)
    assert back["reloaded"] is True and state_of(app, back["rollout"]) == "loading"
    settle(app)
    assert advance(app)[0] == f"{back['rollout']}: loaded -> succeeded"
    r = deploy(client, operator, version="2", strategy="bluegreen")
    settle(app)
    assert advance(app)[0] == f"{r['id']}: loaded -> succeeded"

    # Promoted all the way by a person, then rolled back at once (the previous version is still loaded).
    r = deploy(client, operator, version="1", **held)
    settle(app)
    advance(app)
    assert act(client, operator, r["id"], "promote_all")["state"] == "succeeded"
    back = rollback(client, operator)
    assert back["reloaded"] is False and state_of(app, back["rollout"]) == "succeeded"
    settle(app)
    assert versions_served(client, 10) == {"2": 10}

    # Paused by an inconclusive analysis, then promoted all the way, aborted, or rolled back.
    for action, after in (("promote_all", "succeeded"), ("abort", "aborted"), ("rollback", "rolled_back")):
        r = deploy(client, operator, version=not_stable(client), steps=[50, 100], **stuck)
        settle(app)
        advance(app)
        assert advance(app) == [f"{r['id']}: inconclusive -> paused"]
        if action == "rollback":
            rollback(client, operator)
        else:
            act(client, operator, r["id"], action)
        assert state_of(app, r["id"]) == after
        settle(app)

    # Progressing: aborted, rolled back, failed by its analysis.
    for action, after in (("abort", "aborted"), ("rollback", "rolled_back")):
        r = deploy(client, operator, version=not_stable(client), **held)
        settle(app)
        advance(app)
        rollback(client, operator) if action == "rollback" else act(client, operator, r["id"], action)
        assert state_of(app, r["id"]) == after
    failing = {"min_requests": 10, "slo_p99_ms": 0.001}
    r = deploy(client, operator, version=not_stable(client), steps=[50, 100], pause_s=0, policy=failing)
    settle(app)
    advance(app)
    versions_served(client, 60)
    assert advance(app) == [f"{r['id']}: fail -> rolled_back"]

    assert writes.problems() == []
    assert writes.fired() == set(transitions()), "the table has events no path fires"
    with app.extensions["flightdeck"].sessions() as session:
        assert all(r.finished_at is not None for r in session.scalars(select(Rollout)) if r.state != "loading")


def test_a_state_written_outside_the_writer_is_caught(app, client, operator, writes) -> None:
    r = deploy(client, operator, version="2", steps=[50, 100], pause_s=3600)
    assert writes.problems() == []
    with app.extensions["flightdeck"].sessions() as session, session.begin():
        session.get(Rollout, r["id"]).state = RolloutState.PAUSED  # what the controller used to do
    assert writes.problems() == [
        "state written outside rollout.lifecycle: writes [(None, 'loading'), ('loading', 'paused')], "
        "changes [(None, 'loading')]"
    ]


def test_an_illegal_move_changes_nothing(app, client, operator) -> None:
    r = deploy(client, operator, version="2", steps=[50, 100], pause_s=3600)
    refused = client.post(f"/api/rollouts/{r['id']}/promote", headers=operator)
    assert (
        refused.status_code == 409
        and "cannot promote a rollout that is loading" in refused.get_json()["error"]["message"]
    )
    deployment = client.get("/api/models/mlp/deployment").get_json()
    assert deployment["slots"]["green"] == {"version": "2", "weight": 0}
