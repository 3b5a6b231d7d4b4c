"""The SLOs' Prometheus rules: structure always, and with promtool, which alerts fire for a fast and a slow burn."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from alerts.rules import duration_text
from alerts.slo import SLI, SLO, WINDOWS, burn_rules, load_slos
from controlplane import metrics
from dashboards import prometheus, prometheus_slo
from tests.dashboards.test_prometheus_rules import balanced, exported_names

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not on PATH (Debian/Ubuntu: apt-get install prometheus)"
)
SLOS = load_slos(prometheus.RULES_DIR)
WINDOW_NAMES = ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]


@pytest.fixture(scope="module")
def committed() -> dict:
    return yaml.safe_load(prometheus.OUTPUT.read_text(encoding="utf-8"))


def slo_groups(document: dict) -> dict[str, list[dict]]:
    return {g["name"]: g["rules"] for g in document["groups"] if g["name"].startswith("flightdeck-slo-")}


def test_each_slo_has_a_group_of_recorded_burn_rates_then_its_four_alerts(committed: dict) -> None:
    groups = slo_groups(committed)

    assert list(groups) == [f"flightdeck-slo-{s.name}" for s in SLOS]
    for slo in SLOS:
        rules = groups[f"flightdeck-slo-{slo.name}"]
        records, alerts = rules[: len(WINDOW_NAMES)], rules[len(WINDOW_NAMES) :]
        assert [r["record"] for r in records] == [f"model:flightdeck_slo_burn_rate:rate{w}" for w in WINDOW_NAMES]
        assert all(r["labels"] == {"slo": slo.name} and set(r) == {"record", "expr", "labels"} for r in records)
        assert all(f'model="{slo.model}"' in r["expr"] and f"[{w}]" in r["expr"] for r, w in zip(records, WINDOW_NAMES))
        assert [a["alert"] for a in alerts] == [r.name for r in burn_rules([slo])]
        for alert, window in zip(alerts, WINDOWS, strict=True):
            factor = window.factor(slo.period)
            assert alert["labels"] == {"severity": window.severity.value, "long": duration_text(window.long),
                                       "short": duration_text(window.short), "slo": slo.name}  # fmt: skip
            need = slo.minimum(factor)
            assert alert["for"] == "0s" and f") > {prometheus.number(factor)} and on (model)" in alert["expr"]
            assert alert["expr"].endswith(f"[{duration_text(window.short)}])) >= {need}")
            assert f'rate{duration_text(window.long)}{{slo="{slo.name}"}}' in alert["expr"]
            assert f'rate{duration_text(window.short)}{{slo="{slo.name}"}}' in alert["expr"]
            assert {"summary", "description", "runbook_url", "why"} == set(alert["annotations"])
        for rule in rules:
            assert balanced(rule["expr"]), rule["expr"]


def test_burn_rates_divide_the_bad_share_by_the_budget_over_exported_series() -> None:
    availability = SLO("a", "mlp", SLI.AVAILABILITY, 0.999)
    latency = SLO("l", "mlp", SLI.LATENCY, 0.99, threshold_ms=500)

    (hour,) = [r for r in prometheus_slo.recording_rules(availability) if r["record"].endswith("rate1h")]
    assert hour["expr"] == (
        '(sum by (model) (rate(flightdeck_inference_requests_total{model="mlp",outcome=~"error|timeout|rejected"}[1h]))'
        ' / sum by (model) (rate(flightdeck_inference_requests_total{model="mlp",outcome!="invalid"}[1h]))) / 0.001'
    )
    (hour,) = [r for r in prometheus_slo.recording_rules(latency) if r["record"].endswith("rate1h")]
    assert hour["expr"] == (
        '(1 - sum by (model) (rate(flightdeck_inference_request_seconds_bucket{model="mlp",le="0.5"}[1h]))'
        ' / sum by (model) (rate(flightdeck_inference_request_seconds_count{model="mlp"}[1h]))) / 0.01'
    )
    names = {n for r in prometheus_slo.recording_rules(latency) for n in re.findall(r"flightdeck_[a-z_]+", r["expr"])}
    assert names <= exported_names()


def test_the_latency_buckets_are_the_exported_ones_and_a_threshold_between_edges_is_noted() -> None:
    exported = tuple(b for b in metrics.REQUEST_SECONDS._upper_bounds if b != float("inf"))
    assert prometheus_slo.LATENCY_BUCKETS == exported
    assert prometheus_slo.bucket_edge(250) == 0.25 and prometheus_slo.bucket_edge(300) == 0.25
    assert prometheus_slo.bucket_edge(0.1) == 0.0005  # below every edge: the smallest
    between = SLO("l", "mlp", SLI.LATENCY, 0.99, threshold_ms=300)
    assert prometheus_slo.notes([between]) == [
        "l: 300 ms is not an edge of flightdeck_inference_request_seconds's buckets; "
        "Prometheus counts requests within 250 ms as good"
    ]
    assert prometheus_slo.notes(SLOS) == []  # the shipped thresholds sit on edges


def test_a_minimum_of_requests_is_required_in_both_windows_of_an_alert() -> None:
    declared = SLO("a", "mlp", SLI.AVAILABILITY, 0.999, min_requests=50)
    (fast, *_) = burn_rules([declared])
    counted = (
        'and on (model) sum by (model) (increase(flightdeck_inference_requests_total{model="mlp",outcome!="invalid"}'
    )
    assert prometheus_slo.alert_expression(fast).endswith(f" {counted}[1h])) >= 50 {counted}[5m])) >= 50")
    (five, *_) = prometheus_slo.recording_rules(declared)
    assert "increase" not in five["expr"]  # the burn rate is recorded whatever the traffic; the alerts judge it
    (_, slow, *_) = burn_rules([replace(declared, min_requests=None)])  # by default: one failure alone is no burn
    assert prometheus_slo.alert_expression(slow).endswith(f" {counted}[30m])) >= 167")


def test_the_alert_value_is_the_lower_of_the_two_burn_rates() -> None:
    (fast, *_) = burn_rules([SLO("a", "mlp", SLI.AVAILABILITY, 0.999, min_requests=1)])
    assert prometheus_slo.alert_expression(fast) == (
        '((model:flightdeck_slo_burn_rate:rate1h{slo="a"} <= model:flightdeck_slo_burn_rate:rate5m{slo="a"})'
        ' or model:flightdeck_slo_burn_rate:rate5m{slo="a"}) > 14.4'
    )


@needs_promtool
def test_promtool_fires_pages_for_a_fast_burn_and_tickets_for_a_slow_one(tmp_path: Path, committed: dict) -> None:
    """Feed request counters to the committed rules with `promtool test rules`; check which SLO alerts fire."""
    annotations = {r["alert"]: r["annotations"] for g in committed["groups"] for r in g["rules"] if "alert" in r}
    blue = {"model": "mlp", "version": "1", "slot": "blue"}

    def series(outcome: str, per_minute: int, minutes: int) -> dict:
        labels = ",".join(f'{k}="{v}"' for k, v in {**blue, "outcome": outcome}.items())
        return {"series": f"flightdeck_inference_requests_total{{{labels}}}", "values": f"0+{per_minute}x{minutes}"}

    def fired(name: str, severity: str, long: str, short: str, burn: str) -> dict:
        summary = f"mlp: the error budget of availability 99.9% over 30d burns at {burn}x over {long} and {short}"
        return {"exp_labels": {"model": "mlp", "slo": "mlp_availability", "long": long, "short": short,
                               "severity": severity},
                "exp_annotations": {**annotations[name], "summary": summary}}  # fmt: skip

    def expect(at: str, firing: dict[str, dict | None]) -> list[dict]:
        return [{"eval_time": at, "alertname": name, "exp_alerts": [alert] if alert else []}
                for name, alert in firing.items()]  # fmt: skip

    name = "mlp_availability_burn_{}".format
    fast = [series("success", 98, 200), series("error", 2, 200), series("client_error", 0, 200)]  # 2%: 20x
    # NOTE: a burn rate is a ratio, the same over 7 hours of data as over 25, and the rules have no `for`:
    # evaluating at 7h (every window's short half full) costs promtool a third of 25h's CPU.
    slow = [series("success", 996, 480), series("error", 4, 480)]  # 0.4%: 4x
    fine = [series("success", 500, 200), series("client_error", 500, 200)]  # half refused for their input: fine
    tests = [
        {"interval": "1m", "input_series": fast, "alert_rule_test": expect("2h", {
            name("1h"): fired(name("1h"), "P0", "1h", "5m", "20.0"),
            name("6h"): fired(name("6h"), "P0", "6h", "30m", "20.0"),
            "mlp_latency_burn_1h": None})},
        {"interval": "1m", "input_series": slow, "alert_rule_test": expect("7h", {
            name("1h"): None, name("6h"): None,
            name("1d"): fired(name("1d"), "P1", "1d", "2h", "4.0"),
            name("3d"): fired(name("3d"), "P1", "3d", "6h", "4.0")})},
        {"interval": "1m", "input_series": fine, "alert_rule_test": expect("2h", {
            name(w): None for w in ("1h", "6h", "1d", "3d")})},
    ]  # fmt: skip
    shutil.copy(prometheus.OUTPUT, tmp_path / "rules.yml")
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")

    result = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300
    )

    assert result.returncode == 0, result.stdout + result.stderr
