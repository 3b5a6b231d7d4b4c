"""SLOs: declarations validated at load, burn-rate maths by hand, the multi-window rules generated from them."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, RuleError, duration_text, load_rules
from alerts.slo import (
    SLI,
    SLO,
    WINDOWS,
    BurnRule,
    budget_remaining,
    burn_rate,
    burn_rules,
    load_slos,
    parse_slo,
    with_burn_rules,
)
from alerts.states import Severity

RULES = Path(__file__).resolve().parents[2] / "alerts" / "rules"
RUNBOOKS = ["rollback", "drain_reload", "compact_memory", "set_batching", "shed_load", "diagnostics", "check_drift"]
AVAILABILITY = SLO("mlp_availability", "mlp", SLI.AVAILABILITY, 0.999)
LATENCY = SLO("mlp_latency", "mlp", SLI.LATENCY, 0.99, threshold_ms=250)


def test_the_workbook_factors_for_a_30_day_period() -> None:
    # SRE workbook Table 5-8 (and the 1-day ticket row): 2% of the budget in 1h is 14.4x, 5% in 6h 6x,
    # 10% in 1d 3x, 10% in 3d 1x; the short windows are a twelfth of the long ones.
    rows = [(w.severity, w.factor(timedelta(days=30)), duration_text(w.long), duration_text(w.short)) for w in WINDOWS]
    assert rows == [
        (Severity.P0, 14.4, "1h", "5m"),
        (Severity.P0, 6.0, "6h", "30m"),
        (Severity.P1, 3.0, "1d", "2h"),
        (Severity.P1, 1.0, "3d", "6h"),
    ]
    assert all(w.long == 12 * w.short for w in WINDOWS)


def test_factors_follow_the_period_so_the_same_budget_share_triggers() -> None:
    # 28 days = 672 h: 2% of the budget in 1h is 0.02 * 672 = 13.44x.
    assert [w.factor(timedelta(days=28)) for w in WINDOWS] == [13.44, 5.6, 2.8, 0.933333]


@pytest.mark.parametrize(
    ("bad", "total", "slo", "burn", "left"),
    [
        (1, 1000, AVAILABILITY, 1.0, 0.0),  # 0.1% bad against a 0.1% budget: spent exactly
        (5, 1000, AVAILABILITY, 5.0, -4.0),  # five times the budget: overspent four times over
        (30, 100_000, AVAILABILITY, 0.3, 0.7),  # 0.03% bad: 30% of the budget spent
        (0, 500, AVAILABILITY, 0.0, 1.0),
        (144, 1000, LATENCY, 14.4, -13.4),  # 14.4% slow against a 1% budget
        (25, 10_000, LATENCY, 0.25, 0.75),
    ],
)
def test_burn_rate_and_budget_by_hand(bad: int, total: int, slo: SLO, burn: float, left: float) -> None:
    assert burn_rate(bad, total, slo) == pytest.approx(burn)
    assert budget_remaining(bad, total, slo) == pytest.approx(left)


def test_no_requests_has_no_burn_rate_and_no_budget_figure() -> None:
    assert burn_rate(0, 0, AVAILABILITY) is None
    assert budget_remaining(0, 0, AVAILABILITY) is None


def test_each_slo_generates_one_rule_per_window_with_its_severity_threshold_and_windows() -> None:
    rules = burn_rules([AVAILABILITY])

    assert [r.name for r in rules] == [f"mlp_availability_burn_{w}" for w in ("1h", "6h", "1d", "3d")]
    assert [r.severity for r in rules] == [Severity.P0, Severity.P0, Severity.P1, Severity.P1]
    assert [(r.condition.window, r.short_window) for r in rules] == [(w.long, w.short) for w in WINDOWS]
    for rule in rules:
        assert isinstance(rule, BurnRule) and rule.slo is AVAILABILITY
        assert rule.for_ == timedelta(0) and not rule.automatic.enabled
        assert rule.condition.by == ("model",) and rule.condition.op == ">"
        assert rule.labels == {"slo": "mlp_availability", "long": duration_text(rule.condition.window),
                               "short": duration_text(rule.short_window)}  # fmt: skip
    fast = rules[0]
    assert fast.condition.holds(14.5) and not fast.condition.holds(14.4)
    assert fast.render(fast.summary, {"model": "mlp"}, 20.0) == (
        "mlp: the error budget of availability 99.9% over 30d burns at 20.0x over 1h and 5m"
    )
    assert "2.1 days" in fast.why and "page" in fast.why
    assert "ticket" in rules[3].why and "30.0 days" in rules[3].why


def test_a_latency_slo_says_its_threshold() -> None:
    (rule, *_) = burn_rules([LATENCY])
    assert "latency 99% under 250 ms over 30d" in rule.render(rule.summary, {"model": "mlp"}, 1.0)


def test_the_shipped_slos_load_and_their_rules_join_the_written_ones() -> None:
    slos = load_slos(RULES, RUNBOOKS)
    rules = load_rules(RULES, [*METRICS, *LIVE_METRICS], RUNBOOKS)  # the SLO file is not a rule file

    assert {(s.model, s.sli) for s in slos} == {(m, k) for m in ("mlp", "textcls") for k in SLI}
    assert all(s.period == timedelta(days=30) for s in slos)
    latency = next(s for s in slos if s.name == "mlp_latency")
    assert (latency.objective, latency.threshold_ms) == (pytest.approx(0.99), 250.0)
    combined = with_burn_rules(rules, slos)
    assert len(combined) == len(rules) + 4 * len(slos)
    assert len({r.name for r in combined}) == len(combined)


def test_a_generated_name_may_not_repeat_a_written_rule() -> None:
    (clash, *_) = burn_rules([AVAILABILITY])
    with pytest.raises(RuleError, match="repeat rule names: \\['mlp_availability_burn_1h'\\]"):
        with_burn_rules([clash], [AVAILABILITY])


GOOD = {"name": "m_avail", "model": "m", "sli": "availability", "objective": 99.9}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"objective": 100}, "slo 'm_avail' field 'objective': must be a percentage between 0 and 100"),
        ({"objective": 0.999 * 0}, "slo 'm_avail' field 'objective': must be a percentage between 0 and 100"),
        ({"objective": "99.9"}, "slo 'm_avail' field 'objective': must be a number"),
        ({"objective": True}, "slo 'm_avail' field 'objective': must be a number"),
        ({"sli": "throughput"}, "slo 'm_avail' field 'sli': must be one of ['availability', 'latency']"),
        ({"name": "Bad-Name"}, "slos[0] field 'name': must match"),
        ({"model": ""}, "slo 'm_avail' field 'model': must not be empty"),
        ({"period": "1h"}, "slo 'm_avail' field 'period': must be at least 3d"),
        ({"period": "a month"}, "slo 'm_avail' field 'period': must be a duration like"),
        ({"threshold_ms": 250}, "slo 'm_avail' field 'threshold_ms': applies to latency SLOs only"),
        ({"sli": "latency"}, "slo 'm_avail' field 'threshold_ms': must be a number"),
        ({"sli": "latency", "threshold_ms": 0}, "slo 'm_avail' field 'threshold_ms': must be above 0"),
        ({"min_requests": 0}, "slo 'm_avail' field 'min_requests': must be at least 1"),
        ({"min_requests": 1.5}, "slo 'm_avail' field 'min_requests': must be a whole number"),
        ({"runbook": "reboot"}, "slo 'm_avail' field 'runbook': runbook 'reboot' is not a registered runbook"),
        ({"runbook_params": ["a"]}, "slo 'm_avail' field 'runbook_params': must be a mapping"),
        ({"objectives": 99}, "slo 'm_avail' field 'objectives': is not a known field"),
    ],
)
def test_every_mistake_is_named(change: dict, message: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_slo({**GOOD, **change}, "slo.yaml", RUNBOOKS, index=0)
    assert message in str(caught.value)
    assert str(caught.value).startswith("slo.yaml: ")


def test_a_good_declaration_reads_as_a_fraction_with_defaults() -> None:
    slo = parse_slo(GOOD, "x", RUNBOOKS)
    assert (slo.objective, slo.period, slo.min_requests, slo.runbook) == (
        pytest.approx(0.999),
        timedelta(days=30),
        None,
        "diagnostics",
    )
    assert slo.budget == pytest.approx(0.001)
    # By default a window needs the requests at which one failure alone is no burn above the factor:
    # one failure in 18 requests is a 55x burn of a 99.9% budget, and must not page.
    assert [slo.minimum(w.factor(slo.period)) for w in WINDOWS] == [70, 167, 334, 1001]
    assert replace(slo, min_requests=5).minimum(14.4) == 5


def test_files_of_slos_are_checked_at_load(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("slos:\n  - {name: x, model: m, sli: availability, objective: 99}\n")
    (tmp_path / "b.yaml").write_text("slos:\n  - {name: x, model: n, sli: availability, objective: 99}\n")
    with pytest.raises(RuleError, match=r"b.yaml: slo 'x' field 'name': is already taken by a.yaml slos\[0\]"):
        load_slos(tmp_path)
    (tmp_path / "b.yaml").write_text("slos: {name: y}\n")
    with pytest.raises(RuleError, match="b.yaml: field 'slos': must be a list"):
        load_slos(tmp_path)
    (tmp_path / "b.yaml").write_text("rules: []\n")
    assert [s.name for s in load_slos(tmp_path)] == ["x"]
    assert load_rules(tmp_path, METRICS) == []
