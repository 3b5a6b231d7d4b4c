"""Noise fixed at its cause: a first evaluation, a healthy idle server's memory, empty annotations."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts.rules import LIVE_METRICS, load_rules
from alerts.slo import load_slos, with_burn_rules
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.history.query import METRICS
from controlplane.models import AlertEvent, AlertRecord, DeviceSample
from tests.controlplane.history.conftest import T0, latencies, slot_row

RULES = Path(__file__).resolve().parents[3] / "alerts" / "rules"
MiB = 2**20


def shipped_rules():
    return with_burn_rules(load_rules(RULES, [*METRICS, *LIVE_METRICS]), load_slos(RULES))


def heap(at, reserved_mib: float, in_use_mib: float) -> DeviceSample:
    reserved, in_use = int(reserved_mib * MiB), int(in_use_mib * MiB)
    return DeviceSample(ts=at, resolution_s=0, interval_s=10.0, process="n:1", device="cpu", name="process heap",
                        utilization=None, memory_used_bytes=reserved + 40 * MiB, memory_total_bytes=None,
                        reserved_bytes=reserved, in_use_bytes=in_use,
                        fragmentation=(reserved - in_use) / reserved)  # fmt: skip


def evaluator(sessions, at):
    clock = {"now": at}
    ev = AlertEvaluator(sessions, shipped_rules(), EvaluatorSettings(), engine_ready=lambda: True,
                        clock=lambda: clock["now"])  # fmt: skip
    return ev, clock


def test_a_healthy_idle_server_first_evaluated_records_and_logs_nothing(sessions, caplog) -> None:
    # As measured on a fresh CPU server with both demo models loaded and warmed up, idle: 168.5 MiB
    # reserved, 64.5 MiB in use (ONNX Runtime's warm-up arena, 66 MiB, idle): 62% "fragmented".
    with sessions() as s, s.begin():
        for minute in range(40):
            s.add(heap(T0 - timedelta(minutes=minute), 168.5, 64.5))
        s.add(slot_row(T0 - timedelta(minutes=1), latencies(1, 18), errors=1))  # one failure in 18 requests
    ev, clock = evaluator(sessions, T0)
    with caplog.at_level(logging.INFO, logger="controlplane.alerting.evaluator"):
        assert ev.run()["changed"] == 0
        clock["now"] = T0 + timedelta(minutes=1)
        assert ev.run()["changed"] == 0
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("alert ")] == []
    with sessions() as s:
        assert list(s.scalars(select(AlertEvent))) == []
        rows = {r.rule: r for r in s.scalars(select(AlertRecord))}
    assert {r.state for r in rows.values()} == {"inactive"}
    (fragmented,) = [r for r in rows.values() if r.rule == "memory_fragmented"]
    assert fragmented.value is None and "too little memory held to judge: 168 MiB reserved" in fragmented.summary
    page = rows["textcls_availability_burn_1h"]
    assert page.value is None and "not enough traffic: 18 requests" in page.summary  # no P0 for one failure


def test_a_big_process_mostly_idle_is_fragmented(sessions) -> None:
    with sessions() as s, s.begin():
        for minute in range(15):
            s.add(heap(T0 - timedelta(minutes=minute), 4096, 1024))
    ev, _ = evaluator(sessions, T0)
    assert ev.run()["changed"] == 1
    with sessions() as s:
        (row,) = s.scalars(select(AlertRecord).where(AlertRecord.rule == "memory_fragmented"))
    assert row.state == "pending" and row.value == 0.75


def test_a_full_and_busy_gpu_is_judged_per_device_from_its_rows(sessions) -> None:
    """The GPU rules read the device rows that are not the CPU heap's, each device on its own."""
    with sessions() as s, s.begin():
        for minute in range(15):
            at = T0 - timedelta(minutes=minute, seconds=5)
            for device, used, busy in (("cuda:0", 15.5, 0.95), ("cuda:1", 4.0, 0.10)):
                s.add(DeviceSample(ts=at, resolution_s=0, interval_s=10.0, process="n:1", device=device, name="H200",
                                   utilization=busy, memory_used_bytes=int(used * 2**30),
                                   memory_total_bytes=16 * 2**30))  # fmt: skip
            s.add(heap(at, 4096, 1024))
    ev, _ = evaluator(sessions, T0)
    ev.run()
    with sessions() as s:
        rows = {(r.rule, r.labels.get("device")): r for r in s.scalars(select(AlertRecord))}
    assert rows["gpu_memory_high", "cuda:0"].state == "pending"
    assert rows["gpu_memory_high", "cuda:0"].value == 15.5 / 16
    assert rows["gpu_busy", "cuda:0"].state == "pending" and rows["gpu_busy", "cuda:0"].value == pytest.approx(0.95)
    assert rows["gpu_memory_high", "cuda:1"].state == rows["gpu_busy", "cuda:1"].state == "inactive"
    assert rows["memory_fragmented", "cpu"].value == 0.75  # the heap's rows only


def test_a_message_carries_no_empty_description() -> None:
    from alerts.lifecycle import Tracked
    from alerts.states import AlertState, Severity
    from controlplane.alerting.evaluator import alert_payload

    rules = {r.name: r for r in shipped_rules()}
    labels = {"model": "textcls", "alertname": "x", "severity": "P1"}
    alert = Tracked("f", "high_error_rate", Severity.P1, labels, AlertState.FIRING, value=0.5, firing_since=T0)
    plain = alert_payload(alert, rules["split_traffic_outside_rollout"], EvaluatorSettings(), "firing")
    assert set(plain["annotations"]) == {"summary"}
    burn = alert_payload(alert, rules["textcls_availability_burn_1h"], EvaluatorSettings(), "firing")
    assert burn["annotations"]["description"].startswith("Burn rate = bad share / allowed share")
