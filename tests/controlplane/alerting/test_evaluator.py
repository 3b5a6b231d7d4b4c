"""The evaluator over real history rows in a real SQLite file: state, timeline, outbox, silences."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, load_rules
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.alerting.outbox import deliver_due
from controlplane.models import AlertEvent, AlertRecord, OutboxMessage, Receiver, SilenceRecord
from tests.alerts.notifiers.recorder import deliver_local
from tests.controlplane.history.conftest import T0, latencies, slot_row
from tests.servers import ChatServer

RULES = Path(__file__).resolve().parents[3] / "alerts" / "rules"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self):
        return self.now


@pytest.fixture
def chat():
    with ChatServer() as server:
        yield server


@pytest.fixture
def evaluator(sessions, chat):
    rules = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "high_error_rate"]
    clock = Clock()
    with sessions() as s, s.begin():
        s.add(Receiver(name="chat", kind="webhook", config={"url": chat.url, "allow_http": True},
                       severities=["P0", "P1"], matchers=[], enabled=True, created_at=T0, group_wait_s=0))  # fmt: skip
    runs = []
    ev = AlertEvaluator(
        sessions, rules, EvaluatorSettings(console_url="http://console"), engine_ready=lambda: True,
        run_automatic=lambda rule, row: runs.append((rule.runbook, row.labels["model"])) or f"run-{len(runs)}",
        clock=clock,
    )  # fmt: skip
    return ev, clock, runs


def traffic(sessions, at, errors: int, n: int = 200) -> None:
    with sessions() as s, s.begin():
        s.add(slot_row(at, latencies(int(at.timestamp()) % 1000, n), errors=errors))


def test_errors_fire_after_for_queue_one_message_and_run_the_runbook_once(sessions, evaluator, chat) -> None:
    ev, clock, runs = evaluator
    for minute in range(4):
        traffic(sessions, T0 + timedelta(minutes=minute, seconds=30), errors=40)
    clock.now = T0 + timedelta(minutes=1)
    assert ev.run()["changed"] == 1  # pending
    clock.now = T0 + timedelta(minutes=3, seconds=30)
    counts = ev.run()
    assert counts == {"changed": 1, "queued": 1, "withdrawn": 0, "suppressed": 0, "automatic": 1, "escalated": 0}
    with sessions() as s:
        alert = s.scalars(select(AlertRecord)).one()
        assert (alert.state, alert.labels["model"], alert.labels["version"]) == ("firing", "textcls", "1")
        assert alert.summary == "textcls v1: 20.0% of requests fail"
        message = s.scalars(select(OutboxMessage)).one()
        payload = message.payload["alerts"][0]
        assert message.receiver == "chat" and message.status == "firing" and message.state == "pending"
        assert payload["severity"] == "P0" and payload["value"] == pytest.approx(0.2)
        assert payload["runbook_command"] == "python runbooks/rollback.py --model textcls"
        assert payload["console_url"] == f"http://console/alerts/{alert.fingerprint}"
        kinds = [e.kind for e in s.scalars(select(AlertEvent).order_by(AlertEvent.id))]
    assert kinds == ["state", "state", "notified", "runbook"]
    assert runs == [("rollback", "textcls")]
    assert deliver_due(sessions, now=clock.now, send=deliver_local)["sent"] == 1
    clock.now += timedelta(minutes=1)
    assert ev.run()["automatic"] == 0  # max_attempts 1: not run again
    # Healthy traffic resolves it and queues the resolved message.
    for minute in range(6):
        traffic(sessions, clock.now + timedelta(minutes=minute, seconds=10), errors=0)
    clock.now += timedelta(minutes=6)
    assert ev.run()["queued"] == 1
    with sessions() as s:
        assert s.scalars(select(AlertRecord)).one().state == "resolved"
        statuses = [m.status for m in s.scalars(select(OutboxMessage).order_by(OutboxMessage.id))]
    assert statuses == ["firing", "resolved"]
    assert deliver_due(sessions, now=clock.now, send=deliver_local)["sent"] == 1
    assert [(m["status"], m["groupLabels"]) for m in chat.received] == [
        ("firing", {"alertname": "high_error_rate"}),
        ("resolved", {"alertname": "high_error_rate"}),
    ]
    assert chat.received[1]["groupKey"] == '{}/{severity=~"P0|P1"}:{alertname="high_error_rate"}'


def test_an_evaluation_that_changes_nothing_writes_nothing(sessions, evaluator) -> None:
    """An idle server evaluates every 15 s: with nothing new, no row is written (and no worker woken)."""
    ev, clock, _ = evaluator
    for minute in range(3):
        traffic(sessions, T0 + timedelta(minutes=minute, seconds=30), errors=0)
    clock.now = T0 + timedelta(minutes=3)
    ev.run()
    with sessions() as s:
        first = s.scalars(select(AlertRecord)).one()
    assert (first.state, first.value, first.updated_at) == ("inactive", 0.0, clock.now)
    writes: list[str] = []
    engine = sessions.kw["bind"]

    def listener(_conn, _cursor, statement: str, *_rest) -> None:
        if not statement.lstrip().upper().startswith("SELECT"):
            writes.append(statement)

    event.listen(engine, "before_cursor_execute", listener)
    clock.now += timedelta(seconds=15)
    assert ev.run()["changed"] == 0
    event.remove(engine, "before_cursor_execute", listener)
    assert writes == []
    traffic(sessions, clock.now, errors=40)  # a new value: the row is written, and says when
    clock.now += timedelta(seconds=15)
    ev.run()
    with sessions() as s:
        alert = s.scalars(select(AlertRecord)).one()
    assert alert.value > 0 and alert.updated_at == clock.now


def test_bad_input_from_clients_never_fires_the_error_alert_nor_its_rollback(sessions, evaluator) -> None:
    ev, clock, runs = evaluator
    for minute in range(6):
        with sessions() as s, s.begin():
            at = T0 + timedelta(minutes=minute, seconds=30)
            s.add(slot_row(at, latencies(minute, 200), errors=1, client_errors=120))  # 60% answered 400
    for minute in (1, 4, 6):
        clock.now = T0 + timedelta(minutes=minute)
        assert ev.run()["queued"] == 0
        with sessions() as s:
            assert {a.state for a in s.scalars(select(AlertRecord))} == {"inactive"}  # seen, never pending
    with sessions() as s:
        assert s.scalars(select(OutboxMessage)).all() == []
    assert runs == []


def test_a_silence_keeps_the_state_but_queues_nothing(sessions, evaluator) -> None:
    ev, clock, _ = evaluator
    with sessions() as s, s.begin():
        s.add(SilenceRecord(matchers=[{"label": "model", "value": "textcls"}], starts_at=T0, ends_at=T0 + timedelta(hours=1),
                            author="alice", comment="known issue", created_at=T0))  # fmt: skip
    for minute in range(4):
        traffic(sessions, T0 + timedelta(minutes=minute, seconds=30), errors=40)
    clock.now = T0 + timedelta(minutes=1)
    ev.run()
    clock.now = T0 + timedelta(minutes=3, seconds=30)
    counts = ev.run()
    assert counts["queued"] == 0 and counts["suppressed"] == 1
    with sessions() as s:
        assert s.scalars(select(AlertRecord)).one().state == "firing"
        assert s.scalars(select(OutboxMessage)).all() == []


def test_a_failed_automatic_runbook_is_recorded_and_escalates_the_alert_to_p0(sessions) -> None:
    from controlplane.models import RunbookRun

    rules = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "requests_rejected"]
    rules = [replace(rules[0], automatic=replace(rules[0].automatic, enabled=True, max_attempts=1))]
    with sessions() as s, s.begin():
        s.add(Receiver(name="pager", kind="slack", config={"url": "https://hooks.example/x"}, severities=["P0"],
                       matchers=[], enabled=True, created_at=T0, group_wait_s=0))  # fmt: skip
        run = RunbookRun(runbook="shed_load", params={}, target="engine", trigger="alert", state="running",
                         requested_by="system", requested_at=T0)  # fmt: skip
        s.add(run)
        s.flush()
        run_id = run.id
    clock = Clock()
    ev = AlertEvaluator(sessions, rules, EvaluatorSettings(), engine_ready=lambda: True,
                        run_automatic=lambda rule, row: str(run_id), clock=clock)  # fmt: skip
    for minute in range(12):
        with sessions() as s, s.begin():
            s.add(slot_row(T0 + timedelta(minutes=minute, seconds=30), latencies(minute, 100), rejections=50))
    clock.now = T0 + timedelta(minutes=1)
    ev.run()
    clock.now = T0 + timedelta(minutes=7)
    assert ev.run()["automatic"] == 1  # P1: no message to the P0-only pager, but the runbook starts
    with sessions() as s, s.begin():
        s.get(RunbookRun, run_id).state = "failed"
    clock.now += timedelta(minutes=1)
    counts = ev.run()
    assert counts["escalated"] == 1 and counts["queued"] == 1
    with sessions() as s:
        alert = s.scalars(select(AlertRecord)).one()
        assert alert.severity == "P0" and alert.labels["escalated_from"] == "P1"
        results = [e.detail for e in s.scalars(select(AlertEvent).where(AlertEvent.kind == "runbook_result"))]
        assert results == [{"run": str(run_id), "state": "failed", "error": ""}]
        message = s.scalars(select(OutboxMessage)).one()
        assert message.receiver == "pager" and message.payload["alerts"][0]["severity"] == "P0"
    clock.now += timedelta(minutes=1)
    assert ev.run()["escalated"] == 0  # recorded once


def test_the_client_error_rule_fires_per_kind_of_refusal(sessions) -> None:
    (rule,) = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "high_client_error_rate"]
    clock = Clock()
    ev = AlertEvaluator(sessions, [replace(rule, for_=timedelta(0))], EvaluatorSettings(), engine_ready=lambda: True,
                        clock=clock)  # fmt: skip
    with sessions() as s, s.begin():
        old = slot_row(T0 - timedelta(minutes=5), latencies(1, 40), client_errors=10)  # a row from before kinds
        new = slot_row(T0 - timedelta(minutes=1), latencies(2, 40), client_errors=30)
        new.client_error_kinds = {"shape": 28, "datatype": 2}
        s.add_all([old, new])
    ev.run()
    with sessions() as s:
        rows = {r.labels["reason"]: r for r in s.scalars(select(AlertRecord))}
    # Of 80 requests: 28 refused for their shape (35%) fire; 10 runtime (12.5%) and 2 datatype do not.
    assert {reason: (row.state, round(row.value, 3)) for reason, row in rows.items()} == {
        "datatype": ("inactive", 0.025),
        "runtime": ("inactive", 0.125),
        "shape": ("firing", 0.35),
    }
    assert "of requests refused for their input (shape)" in rows["shape"].summary
