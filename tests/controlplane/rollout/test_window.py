"""Which history rows a step is judged on, and when: synthetic rows over a real migrated SQLite file.

The old analysis took every row with a timestamp after the step's start: a row that began before
the step counted in it, and a step shorter than the sampling interval saw no rows at all ("only 0
requests reached the candidate"). The controller runs with explicit times here.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from controlplane.models import Rollout, RolloutMeasurement, SlotStatus
from controlplane.rollout import controller, service
from controlplane.rollout.audit import system_audit
from controlplane.rollout.deployments import first_deploy
from controlplane.rollout.service import RolloutSettings
from tests.controlplane.history.conftest import T0, latencies, slot_row

SETTINGS = RolloutSettings(history_interval_s=10, scale_down_delay_s=3600)
PAUSE = 8.0


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def start_step(sessions) -> int:
    """mlp v1 stable in blue, v2 loaded in green and at its first step (10 %) from T0 on."""
    with sessions() as s, s.begin():
        first_deploy(s, "mlp", "1", system_audit, T0 - seconds(600))
        rollout = service.deploy(
            s, "mlp", "2", "otto", system_audit, steps=[10, 100], pause_s=PAUSE, policy={"min_requests": 50},
            now=T0 - seconds(5),
        )  # fmt: skip
        s.add(SlotStatus(process="p1", model="mlp", slot="green", version="2", state="loaded", error="",
                         generation=1, updated_at=T0))  # fmt: skip
        assert controller.tick(s, system_audit, SETTINGS, T0) == [f"{rollout.id}: loaded -> progressing"]
        return rollout.id


def row(end: float, n: int, *, slot: str, interval: float = 10.0, errors: int = 0):
    version = "2" if slot == "green" else "1"
    return slot_row(T0 + seconds(end), latencies(int(end * 10) + n, n), slot=slot, version=version,
                    model="mlp", interval=interval, errors=errors)  # fmt: skip


def tick(sessions, at: float) -> list[str]:
    with sessions() as s, s.begin():
        return controller.tick(s, system_audit, SETTINGS, T0 + seconds(at))


def test_a_step_shorter_than_the_sampling_interval_waits_for_its_rows_and_leaves_out_earlier_ones(sessions) -> None:
    rollout = start_step(sessions)
    with sessions() as s, s.begin():
        # Rows that end inside the step but began before it: the previous split's traffic, left out.
        s.add_all([row(3, 9000, slot="blue", errors=900), row(3, 0, slot="green")])
        # The reconciler's row at the split (0.5 s after it), then the first interval fully inside.
        s.add_all([row(0.5, 40, slot="blue", interval=0.5), row(0.5, 0, slot="green", interval=0.5)])
    assert tick(sessions, PAUSE + 0.1) == []  # the pause is over, but no row covers it yet: wait
    with sessions() as s, s.begin():
        s.add_all([row(10.5, 900, slot="blue"), row(10.5, 100, slot="green")])
    assert tick(sessions, 10.6) == [f"{rollout}: pass -> succeeded"]
    with sessions() as s:
        m = s.scalars(select(RolloutMeasurement)).one()
    window = m.evidence[0]
    assert window["check"] == "window" and window["seconds"] == 10.5 and window["early"] is False
    # 100 candidate requests, 940 stable ones: not the 9,000 (with 10 % errors) that began before the step.
    errors = next(e for e in m.evidence if e["check"] == "error rate")
    assert errors["samples"] == {"candidate": 100, "stable": 940, "candidate_events": 0, "stable_events": 0}


def test_with_no_rows_the_step_is_judged_on_what_there_is_two_intervals_after_its_pause(sessions) -> None:
    rollout = start_step(sessions)
    assert tick(sessions, PAUSE + 19) == []
    assert tick(sessions, PAUSE + 20.5) == [f"{rollout}: inconclusive -> paused"]
    with sessions() as s:
        assert "only 0 requests reached the candidate" in s.get(Rollout, rollout).reason


def test_a_clear_failure_ends_the_step_before_its_pause(sessions) -> None:
    rollout = start_step(sessions)
    with sessions() as s, s.begin():
        s.add_all([row(3, 2700, slot="blue", interval=3), row(3, 300, slot="green", interval=3, errors=60)])
    assert tick(sessions, 3.1) == [f"{rollout}: fail -> rolled_back"]
    with sessions() as s:
        m = s.scalars(select(RolloutMeasurement)).one()
        assert m.evidence[0]["early"] is True and m.evidence[0]["alpha"] == 0.0001
        assert s.get(Rollout, rollout).reason.startswith("analysis failed early: error rate 20.00%")


def test_a_gone_process_neither_promotes_nor_rolls_back_a_loading_candidate(sessions) -> None:
    from controlplane.models import EngineStatus

    def beat(s, process: str, at) -> None:
        s.merge(EngineStatus(process=process, generation=1, compact_generation=0, error="", updated_at=at))

    def report(s, process: str, state: str) -> None:
        s.merge(SlotStatus(process=process, model="mlp", slot="green", version="2", state=state, error="no memory",
                           generation=1, updated_at=T0))  # fmt: skip

    settings = RolloutSettings(history_interval_s=10, scale_down_delay_s=3600, process_gone_after_s=30)
    with sessions() as s, s.begin():
        first_deploy(s, "mlp", "1", system_audit, T0 - seconds(600))
        rollout = service.deploy(s, "mlp", "2", "otto", system_audit, steps=[10, 100], now=T0 - seconds(5))
        beat(s, "dead:1", T0 - seconds(31))  # silent for more than three heartbeats: gone
        report(s, "dead:1", "failed")
        beat(s, "dead:2", T0 - seconds(31))
        report(s, "dead:2", "loaded")
        assert controller.tick(s, system_audit, settings, T0) == []  # still loading: nobody alive has said
        beat(s, "live:3", T0 - seconds(2))
        report(s, "live:3", "loaded")
        assert controller.tick(s, system_audit, settings, T0) == [f"{rollout.id}: loaded -> progressing"]
