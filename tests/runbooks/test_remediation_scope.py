"""Automatic remediation's scope: one cooldown per runbook and target, and no second run while one acts.

The alert evaluator over real history rows, the real runner and a real script (`hold`, which
blocks on a named pipe), over one SQLite file: two sibling alerts on one model share one rollback.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, Automatic, load_rules
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.models import AlertEvent, AlertRecord
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.automatic import alert_runner
from tests.controlplane.history.conftest import latencies, slot_row
from tests.runbooks.conftest import fetch, start

RULES = Path(__file__).resolve().parents[2] / "alerts" / "rules"
COOLDOWN = timedelta(minutes=15)


def open_gate(gate: Path) -> None:
    with gate.open("w") as pipe:  # blocks until the runbook has opened its end: the run is surely running
        pipe.write("go\n")


@pytest.fixture
def evaluator(sessions, runner, clock, gate) -> AlertEvaluator:
    """high_error_rate as shipped, but remediating with `hold` (twice per alert at most) on the alert's model."""
    (rule,) = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "high_error_rate"]
    rule = replace(
        rule, runbook="hold", runbook_params={"model": "{model}", "gate": str(gate)},
        automatic=Automatic(enabled=True, cooldown=COOLDOWN, max_attempts=2),
    )  # fmt: skip
    # NOTE: one clock for the history, the evaluator, the runner and its hook, so cooldowns compare like with like.
    return AlertEvaluator(sessions, [rule], EvaluatorSettings(), lambda: True, alert_runner(runner, clock), clock)


def failing_versions(sessions, clock, minutes: int) -> None:
    """Versions 1 and 2 of textcls both fail 20% of requests for `minutes` minutes: two sibling alerts."""
    with sessions() as s, s.begin():
        for minute in range(minutes):
            for version in ("1", "2"):
                at = clock.now + timedelta(minutes=minute, seconds=30)
                s.add(slot_row(at, latencies(minute, 200), errors=40, version=version))


def timeline(sessions) -> dict[str, list[tuple[str, dict]]]:
    """Each alert's runbook entries, by version: (kind, detail)."""
    with sessions() as s:
        versions = {a.fingerprint: a.labels["version"] for a in s.scalars(select(AlertRecord))}
        events = s.scalars(
            select(AlertEvent).where(AlertEvent.kind.in_(("runbook", "runbook_skipped"))).order_by(AlertEvent.id)
        )
        result: dict[str, list[tuple[str, dict]]] = {"1": [], "2": []}
        for event in events:
            result[versions[event.fingerprint]].append((event.kind, event.detail))
    return result


def runs(sessions) -> list[RunbookRun]:
    with sessions() as s:
        return list(s.scalars(select(RunbookRun).order_by(RunbookRun.id)))


def test_sibling_alerts_share_one_run_and_one_cooldown_per_runbook_and_target(
    sessions, runner, clock, gate, evaluator
) -> None:
    start = clock.now
    failing_versions(sessions, clock, 40)
    clock.now = start + timedelta(minutes=1)
    evaluator.run()  # both pending
    clock.now = start + timedelta(minutes=3, seconds=30)
    assert evaluator.run()["automatic"] == 1  # both fire; the first starts `hold` on model:textcls
    (first,) = runs(sessions)
    assert (first.target, first.state, first.trigger) == ("model:textcls", "queued", "alert")
    entries = timeline(sessions)
    starter, sibling = ("1", "2") if entries["1"][0][0] == "runbook" else ("2", "1")
    assert entries[starter] == [("runbook", {"runbook": "hold", "run": str(first.id), "attempt": 1})]
    ((kind, detail),) = entries[sibling]
    assert kind == "runbook_skipped" and detail["runbook"] == "hold"
    assert detail["why"] == f"run {first.id} (hold, queued) is acting on model:textcls"

    assert runner.sweep()["started"] == 1  # the run starts once the evaluation committed; it holds the model
    for _ in range(3):
        clock.now += timedelta(seconds=20)  # (within the run's deadline: past it, the runner presumes it lost)
        assert evaluator.run()["automatic"] == 0  # the sibling does not even try while the run acts
    assert len(timeline(sessions)[sibling]) == 1  # and says why once, not once per evaluation
    with sessions() as s:
        attempts = {a.labels["version"]: a.runbook_attempts for a in s.scalars(select(AlertRecord))}
    assert attempts == {starter: 1, sibling: 0}  # a skip spends none of the sibling's allowance

    open_gate(gate)
    assert runner.wait(first.id, 60)
    assert runs(sessions)[0].state == "succeeded"
    clock.now += timedelta(seconds=8)  # the case: a sibling's rollback 8 s after the first ended
    assert evaluator.run()["automatic"] == 0
    clock.now += timedelta(minutes=1)
    assert evaluator.run()["automatic"] == 0
    (_, (kind, detail)) = timeline(sessions)[sibling]
    assert kind == "runbook_skipped"
    assert detail["why"] == f"run {first.id} of hold on model:textcls began less than 15m ago (its cooldown)"
    assert len(runs(sessions)) == 1

    clock.now = first.requested_at + COOLDOWN + timedelta(seconds=1)
    assert evaluator.run()["automatic"] == 1  # the cooldown is over: one more run, for one of the two
    assert [r.target for r in runs(sessions)] == ["model:textcls", "model:textcls"]


def test_a_persons_run_on_the_model_counts_and_a_dry_run_does_not(
    sessions, runner, clock, gate, people, evaluator
) -> None:
    dry = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["otto"], dry_run=True)
    assert runner.wait(dry, 60) and fetch(sessions, dry).state == "succeeded"
    by_hand = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["otto"])
    open_gate(gate)
    assert runner.wait(by_hand, 60) and fetch(sessions, by_hand).state == "succeeded"
    begun = clock.now
    failing_versions(sessions, clock, 10)
    clock.now = begun + timedelta(minutes=1)
    evaluator.run()
    clock.now = begun + timedelta(minutes=3, seconds=30)
    assert evaluator.run()["automatic"] == 0  # the operator's rollback of this model began minutes ago
    whys = [detail["why"] for entries in timeline(sessions).values() for _, detail in entries]
    assert whys == [f"run {by_hand} of hold on model:textcls began less than 15m ago (its cooldown)"] * 2
