"""Why an alert stops holding: back within the threshold, no data, or too little traffic (`min_requests`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from alerts.catalogue import METRICS
from alerts.lifecycle import Tracked, evaluate
from alerts.rules import LIVE_METRICS, REQUEST_METRICS, Condition, Insufficient, Rule, RuleError, load_rules
from alerts.states import AlertState, Severity

RULES = Path(__file__).resolve().parents[2] / "alerts" / "rules"
KNOWN = [*METRICS, *LIVE_METRICS]
T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
KEY = (("model", "textcls"),)


def rule(min_requests: int = 20) -> Rule:
    condition = Condition("error_rate", "avg", timedelta(minutes=5), ">", 0.05, ("model",), min_requests)
    return Rule("high_error_rate", Severity.P0, "why", condition, timedelta(0), "{model}: {value:.1%} fail")


def firing(r: Rule) -> dict[str, Tracked]:
    (alert,) = evaluate(r, {KEY: 0.5}, {}, T0)
    assert alert.state is AlertState.FIRING and alert.reason == ""
    return {alert.fingerprint: alert}


def next_state(r: Rule, observed: dict, state: dict[str, Tracked]) -> Tracked:
    (alert,) = evaluate(r, observed, state, T0 + timedelta(minutes=1))
    return alert


def test_back_within_the_threshold_resolves_with_the_value_now() -> None:
    r = rule()
    alert = next_state(r, {KEY: 0.01}, firing(r))
    assert (alert.state, alert.value, alert.reason) == (AlertState.RESOLVED, 0.01, "1.0%, no longer > 5.0%")


def test_no_data_resolves_without_a_value_and_says_so() -> None:
    r = rule()
    alert = next_state(r, {}, firing(r))
    assert (alert.state, alert.value) == (AlertState.RESOLVED, None)  # not the last firing value, 0.5
    assert alert.reason == "no data in the last 5m: no traffic, or nothing sampled"
    assert r.render(r.summary, alert.labels, alert.value) == "textcls: n/a fail"  # never 'nan%'


def test_too_little_traffic_never_holds_and_says_how_little() -> None:
    r = rule()
    few = r.condition.too_little_traffic(3)
    assert few == Insufficient("not enough traffic: 3 requests in 5m, fewer than the 20 needed")
    alert = next_state(r, {KEY: few}, firing(r))
    assert (alert.state, alert.value, alert.reason) == (AlertState.RESOLVED, None, few.reason)
    (fresh,) = evaluate(r, {KEY: r.condition.too_little_traffic(1)}, {}, T0)
    assert (fresh.state, fresh.value) == (AlertState.INACTIVE, None)  # seen, never pending
    assert fresh.reason == "not enough traffic: 1 request in 5m, fewer than the 20 needed"


def test_values_are_written_as_the_summary_writes_them() -> None:
    r = rule()
    assert r.format_value(0.123) == "12.3%"
    plain = Rule("r", Severity.P2, "why", r.condition, timedelta(0), "no value here")
    assert plain.format_value(0.123) == "0.123"
    broken = Rule("r", Severity.P2, "why", r.condition, timedelta(0), "{value:%%}")
    assert broken.format_value(0.5) == "0.5"


def test_the_default_rate_rules_need_twenty_requests() -> None:
    rules = load_rules(RULES, KNOWN)
    rates = {r.name: r.condition.min_requests for r in rules if r.condition.metric.endswith("_rate")}
    assert rates and set(rates.values()) == {20}, rates
    assert {"high_error_rate", "high_client_error_rate", "high_timeout_rate", "requests_rejected"} <= set(rates)


GOOD = """
rules:
  - name: r
    severity: P1
    why: because it matters to someone
    condition: {metric: error_rate, aggregation: avg, window: 5m, op: ">", threshold: 0.1, min_requests: 20}
    for: 1m
    summary: s
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("min_requests: 20", "min_requests: -1"), "field 'condition.min_requests': must be at least 0"),
        (("min_requests: 20", "min_requests: 2.5"), "field 'condition.min_requests': must be a whole number"),
        (("min_requests: 20", "min_requests: true"), "field 'condition.min_requests': must be a whole number"),
        (
            ("metric: error_rate", "metric: gpu_memory_fill"),
            "field 'condition.min_requests': applies only to metrics over requests",
        ),
        (("metric: error_rate", "metric: notification_failures"), "field 'condition.min_requests': applies only"),
    ],
)
def test_min_requests_mistakes_are_refused(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    (tmp_path / "x.yaml").write_text(GOOD.replace(*change))
    with pytest.raises(RuleError) as refused:
        load_rules(tmp_path, KNOWN)
    assert message in str(refused.value) and str(refused.value).startswith("x.yaml: rule 'r' ")


def test_min_requests_loads_on_request_metrics_and_defaults_to_none(tmp_path: Path) -> None:
    assert {"error_rate", "p99"} <= REQUEST_METRICS and "queue_fill" not in REQUEST_METRICS
    (tmp_path / "x.yaml").write_text(GOOD.replace("metric: error_rate", "metric: p99"))
    assert load_rules(tmp_path, KNOWN)[0].condition.min_requests == 20
    (tmp_path / "x.yaml").write_text(GOOD.replace(", min_requests: 20", ""))
    assert load_rules(tmp_path, KNOWN)[0].condition.min_requests == 0
