"""The Prometheus rule file: committed file up to date, well formed, over metrics we export, true to the rules."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from alerts.catalogue import METRICS
from alerts.rules import AGGREGATIONS, LIVE_METRICS, Condition, Rule, duration_text, load_rules
from alerts.states import Severity
from controlplane import metrics
from dashboards import prometheus
from serving.batching import RequestOutcome

METRIC_NAME = re.compile(r"\bflightdeck_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not on PATH (Debian/Ubuntu: apt-get install prometheus)"
)


@pytest.fixture(scope="module")
def text() -> str:
    return prometheus.OUTPUT.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def committed(text: str) -> dict:
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def source_rules() -> list[Rule]:
    return load_rules(prometheus.RULES_DIR, [*METRICS, *LIVE_METRICS])


def exported_names() -> set[str]:
    """Every series name controlplane.metrics exposes, as prometheus_client writes them."""
    names = set()
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase):
            for family in collector.describe():
                names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")  # a recording rule's name, level:metric:operations


def alerting_rules(document: dict) -> list[dict]:
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def translated_groups(document: dict) -> list[dict]:
    """The groups translated from the alert rules (the SLOs' groups are tested in test_prometheus_slo)."""
    return [group for group in document["groups"] if not group["name"].startswith("flightdeck-slo-")]


def a_rule(metric: str, aggregation: str = "avg", by: tuple[str, ...] = ("model",), **fields: object) -> Rule:
    condition = Condition(metric, aggregation, timedelta(minutes=5), ">", 0.5, by)
    return replace(
        Rule("r", Severity.P1, "because", condition, timedelta(minutes=2), "{model}: {value:.1%}", source="x.yaml[0]"),
        **fields,
    )


def balanced(expr: str) -> bool:
    for opening, closing in ("()", "{}", "[]"):
        depth = 0
        for char in expr:
            depth += (char == opening) - (char == closing)
            if depth < 0:
                return False
        if depth:
            return False
    return True


def test_committed_file_is_what_the_generator_writes(text: str) -> None:
    assert text == prometheus.render(METRICS), "run: python -m dashboards.prometheus"


def test_main_writes_the_file_and_check_notices_drift(tmp_path: Path) -> None:
    output = tmp_path / "prometheus" / "rules.yml"

    assert prometheus.main(["--check", "--output", str(output)]) == 1
    assert prometheus.main(["--output", str(output)]) == 0
    assert output.read_text(encoding="utf-8") == prometheus.render(METRICS)
    assert prometheus.main(["--check", "--output", str(output)]) == 0
    output.write_text(output.read_text(encoding="utf-8").replace("for: 2m", "for: 3m"), encoding="utf-8")
    assert prometheus.main(["--check", "--output", str(output)]) == 1


def test_options_reach_the_file(tmp_path: Path) -> None:
    output = tmp_path / "rules.yml"

    prometheus.main(["--output", str(output), "--external-url", "https://fd.internal/", "--max-queue-size", "64"])

    document = yaml.safe_load(output.read_text(encoding="utf-8"))
    by_name = {r["alert"]: r for r in alerting_rules(document)}
    assert by_name["high_error_rate"]["annotations"]["runbook_url"] == "https://fd.internal/runbooks/rollback"
    assert by_name["queue_near_limit"]["expr"].endswith("/ 64) > 0.8")


def test_rendering_is_deterministic() -> None:
    assert prometheus.render(METRICS) == prometheus.render(list(reversed(list(METRICS))))


def test_rule_file_structure(committed: dict) -> None:
    assert set(committed) == {"groups"}
    names = [g["name"] for g in translated_groups(committed)]
    assert names == ["flightdeck-operations", "flightdeck-resources", "flightdeck-serving"]
    for group in translated_groups(committed):
        assert set(group) == {"name", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
            assert re.fullmatch(r"[a-z_][a-z0-9_]*", rule["alert"])
            assert re.fullmatch(r"\d+[smhd]", rule["for"])
            assert isinstance(rule["expr"], str) and balanced(rule["expr"]), rule["expr"]
            assert all(isinstance(v, str) for v in [*rule["labels"].values(), *rule["annotations"].values()])
            assert {"summary", "why"} <= set(rule["annotations"])
            assert set(rule["annotations"]) <= {"summary", "description", "runbook_url", "why"}


def test_one_alert_per_translatable_rule_with_its_severity_for_and_file(
    committed: dict, source_rules: list[Rule]
) -> None:
    kept = [r for r in source_rules if r.condition.metric in prometheus.TRANSLATORS]
    by_name = {r["alert"]: (g["name"], r) for g in translated_groups(committed) for r in g["rules"]}

    assert list(by_name) == [r.name for r in kept]
    for rule in kept:
        group, alert = by_name[rule.name]
        assert alert["labels"] == {"severity": rule.severity.value, **rule.labels}
        assert alert["for"] == duration_text(rule.for_)
        assert group == f"flightdeck-{rule.source.split('.yaml')[0]}"
        assert alert["annotations"]["why"] == rule.why
        assert alert["expr"].endswith(f" {rule.condition.op} {prometheus.number(rule.condition.threshold)}")
        if rule.runbook:
            assert alert["annotations"]["runbook_url"] == f"{prometheus.EXTERNAL_URL}/runbooks/{rule.runbook}"


def test_skipped_rules_are_exactly_those_without_a_counterpart(text: str, source_rules: list[Rule]) -> None:
    result = prometheus.translate(source_rules)
    expected = [r.name for r in source_rules if r.condition.metric in prometheus.NO_COUNTERPART]

    assert [s.rule for s in result.skipped] == expected
    assert set(expected) == {"automatic_rollback", "webhook_deliveries_failing", "memory_fragmented", "model_drift"}
    header = text.split("\ngroups:")[0]
    for skipped in result.skipped:
        assert f"#   - {skipped.rule} ({skipped.metric}): {skipped.reason}" in header
    assert "Prometheus cannot see whether a rollout is in progress" in header


def test_every_flightdeck_metric_is_translated_or_declared_without_counterpart() -> None:
    known = {*METRICS, *LIVE_METRICS}

    assert not set(prometheus.TRANSLATORS) & set(prometheus.NO_COUNTERPART)
    assert set(prometheus.TRANSLATORS) | set(prometheus.NO_COUNTERPART) == known


def test_every_metric_in_an_expression_is_exported(committed: dict) -> None:
    exported = exported_names()
    every = [rule for group in committed["groups"] for rule in group["rules"]]
    used = {name for rule in every for name in METRIC_NAME.findall(RECORDED.sub("", rule["expr"]))}

    assert used and used <= exported, f"not exported by controlplane.metrics: {sorted(used - exported)}"


@pytest.mark.parametrize("metric", sorted(prometheus.TRANSLATORS))
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_every_translation_is_balanced_and_over_exported_metrics(metric: str, aggregation: str) -> None:
    expr, _note = prometheus.expression(a_rule(metric, aggregation, by=("model", "device")))

    assert balanced(expr), expr
    assert set(METRIC_NAME.findall(expr)) <= exported_names()
    assert expr.endswith(") > 0.5")
    assert "device" not in expr


def test_label_values_in_expressions_are_ones_we_emit(text: str) -> None:
    outcomes = {o for group in re.findall(r'outcome[!=]~?"([^"]+)"', text) for o in group.split("|")}
    assert outcomes <= {o.value for o in RequestOutcome} | {"invalid"}


@pytest.mark.parametrize(
    ("name", "expr"),
    [
        (
            "high_error_rate",
            '(sum by (model, version) (rate(flightdeck_inference_requests_total{outcome="error"}[5m])) / '
            'sum by (model, version) (rate(flightdeck_inference_requests_total{outcome!="invalid"}[5m]))) > 0.05',
        ),
        (
            "p99_over_slo",
            "(histogram_quantile(0.99, sum by (le, model, version) "
            "(rate(flightdeck_inference_request_seconds_bucket[5m]))) * 1000) > 500",
        ),
        ("queue_near_limit", "(max by (model) (max_over_time(flightdeck_queue_depth[5m])) / 128) > 0.8"),
        ("engine_not_ready", "(min(flightdeck_engine_ready) or on() vector(0)) < 1"),
        (
            "split_traffic_outside_rollout",
            "(count by (model) (max by (model, slot) (flightdeck_traffic_weight) > 0)) > 1",
        ),
        ("gpu_busy", "(avg by (node, gpu) (avg_over_time(flightdeck_gpu_utilization_ratio[15m]))) > 0.8"),
        (
            "gpu_memory_high",
            "(max by (node, gpu) (max_over_time((flightdeck_gpu_memory_used_bytes / "
            "flightdeck_gpu_memory_total_bytes)[5m:]))) > 0.9",
        ),
    ],
)
def test_default_rules_translate_as_documented(committed: dict, name: str, expr: str) -> None:
    by_name = {r["alert"]: r for r in alerting_rules(committed)}
    assert by_name[name]["expr"] == expr


def test_aggregations_pick_the_matching_over_time_function() -> None:
    def expr(metric: str, aggregation: str) -> str:
        return prometheus.expression(a_rule(metric, aggregation, by=("device",)))[0]

    assert (
        expr("gpu_utilization", "max")
        == "(max by (node, gpu) (max_over_time(flightdeck_gpu_utilization_ratio[5m]))) > 0.5"
    )
    assert (
        expr("gpu_utilization", "min")
        == "(min by (node, gpu) (min_over_time(flightdeck_gpu_utilization_ratio[5m]))) > 0.5"
    )
    assert expr("gpu_utilization", "last") == "(max by (node, gpu) (flightdeck_gpu_utilization_ratio)) > 0.5"
    assert expr("gpu_memory_fill", "last") == (
        "(max by (node, gpu) (flightdeck_gpu_memory_used_bytes / flightdeck_gpu_memory_total_bytes)) > 0.5"
    )
    # The history keeps each interval's largest queue, so over the whole window the queue's avg is its max.
    assert "max_over_time(flightdeck_queue_depth[5m])" in expr("queue_fill", "avg")
    assert "min_over_time(flightdeck_queue_depth[5m])" in expr("queue_fill", "min")


def test_counters_read_as_a_rate_over_the_window_and_note_other_aggregations() -> None:
    expr, note = prometheus.expression(a_rule("throughput"))
    assert (
        expr
        == '(sum by (model) (rate(flightdeck_inference_requests_total{outcome=~"success|error|client_error"}[5m]))) > 0.5'
    )
    assert note is None

    expr, note = prometheus.expression(a_rule("p90", "max", by=()))
    assert (
        expr
        == "(histogram_quantile(0.9, sum by (le) (rate(flightdeck_inference_request_seconds_bucket[5m]))) * 1000) > 0.5"
    )
    assert note and "max of p90" in note

    expr, _ = prometheus.expression(a_rule("padding_waste", by=("model", "version", "slot")))
    assert expr.startswith('(1 - sum by (model, version, slot) (rate(flightdeck_sequence_tokens_total{kind="real"}')
    assert prometheus.expression(a_rule("fragmentation")) is None


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            "{model} v{version}: {value:.1%} fail",
            "{{ $labels.model }} v{{ $labels.version }}: {{ $value | humanizePercentage }} fail",
        ),
        ("p99 {value:.0f} ms", 'p99 {{ printf "%.0f" $value }} ms'),
        ("{value:d} left, {value}", '{{ printf "%.0f" $value }} left, {{ $value }}'),
        ("{device}: {value:>8}", "gpu{{ $labels.gpu }}: {{ $value }}"),
        ("team {team}, {alertname} ({severity})", "team ml, r (P1)"),
        ("{{literal}} {model}", '{{ "{" }}literal} {{ $labels.model }}'),
        ("broken {model", 'broken {{ "{" }}model'),
    ],
)
def test_summaries_become_go_templates(template: str, expected: str) -> None:
    assert prometheus.go_template(template, a_rule("error_rate", labels={"team": "ml"})) == expected


@pytest.mark.parametrize(
    ("value", "text"), [(timedelta(0), "0s"), (timedelta(seconds=90), "90s"), (timedelta(minutes=5), "5m"),
                        (timedelta(hours=2), "2h"), (timedelta(days=1), "1d"), (timedelta(minutes=90), "90m")],
)  # fmt: skip
def test_durations(value: timedelta, text: str) -> None:
    assert duration_text(value) == text


def test_numbers() -> None:
    assert [prometheus.number(v) for v in (500.0, 0.05, 1.0, 0.0, 1e-05)] == ["500", "0.05", "1", "0", "1e-05"]


def test_importing_the_generator_pulls_in_no_web_framework_or_database() -> None:
    code = (
        "import sys, dashboards.prometheus; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'sqlalchemy', 'controlplane')); "
        "sys.exit(', '.join(bad) or None)"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@needs_promtool
def test_promtool_check_rules_passes() -> None:
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(prometheus.OUTPUT)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _series(name: str, labels: dict[str, str], values: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


@needs_promtool
def test_promtool_unit_tests_fire_and_render_the_alerts(tmp_path: Path, committed: dict) -> None:
    """Feed series to the committed rules with `promtool test rules`; check which alerts fire and their summaries."""
    annotations = {r["alert"]: r["annotations"] for r in alerting_rules(committed)}
    blue = {"model": "mlp", "version": "1", "slot": "blue"}

    def alert(name: str, labels: dict[str, str], summary: str) -> dict:
        return {"exp_labels": {**labels, "severity": committed_severity(name)},
                "exp_annotations": {**annotations[name], "summary": summary}}  # fmt: skip

    def committed_severity(name: str) -> str:
        return next(r["labels"]["severity"] for r in alerting_rules(committed) if r["alert"] == name)

    failing = [
        _series("flightdeck_inference_requests_total", {**blue, "outcome": "success"}, "0+90x30"),
        _series("flightdeck_inference_requests_total", {**blue, "outcome": "error"}, "0+10x30"),
        # Refused before reaching a slot: not part of the error rate's denominator.
        _series(
            "flightdeck_inference_requests_total",
            {"model": "mlp", "version": "", "slot": "", "outcome": "invalid"},
            "0+1000x30",
        ),  # fmt: skip
        _series("flightdeck_inference_request_seconds_bucket", {**blue, "le": "0.5"}, "0x30"),
        _series("flightdeck_inference_request_seconds_bucket", {**blue, "le": "1.0"}, "0+100x30"),
        _series("flightdeck_inference_request_seconds_bucket", {**blue, "le": "+Inf"}, "0+100x30"),
        _series("flightdeck_queue_depth", blue, "120x30"),
        _series("flightdeck_gpu_memory_used_bytes", {"gpu": "0"}, "95x30"),
        _series("flightdeck_gpu_memory_total_bytes", {"gpu": "0"}, "100x30"),
        _series("flightdeck_traffic_weight", {"model": "mlp", "slot": "blue"}, "50x30"),
        _series("flightdeck_traffic_weight", {"model": "mlp", "slot": "green"}, "50x30"),
    ]
    healthy = [
        _series("flightdeck_inference_requests_total", {**blue, "outcome": "success"}, "0+99x30"),
        _series("flightdeck_inference_requests_total", {**blue, "outcome": "error"}, "0+1x30"),
        _series("flightdeck_engine_ready", {}, "1x30"),
        _series("flightdeck_queue_depth", blue, "3x30"),
        _series("flightdeck_traffic_weight", {"model": "mlp", "slot": "blue"}, "100x30"),
        _series("flightdeck_traffic_weight", {"model": "mlp", "slot": "green"}, "0x30"),
    ]
    mlp1 = {"model": "mlp", "version": "1"}
    tests = [
        {
            "interval": "1m",
            "input_series": failing,
            "alert_rule_test": [
                {
                    "eval_time": "20m",
                    "alertname": "high_error_rate",
                    "exp_alerts": [alert("high_error_rate", mlp1, "mlp v1: 10% of requests fail")],
                },
                {
                    "eval_time": "20m",
                    "alertname": "p99_over_slo",
                    "exp_alerts": [alert("p99_over_slo", mlp1, "mlp v1: p99 995 ms is over the 500 ms SLO")],
                },
                {
                    "eval_time": "20m",
                    "alertname": "queue_near_limit",
                    "exp_alerts": [alert("queue_near_limit", {"model": "mlp"}, "mlp: queue 93.75% full")],
                },
                {
                    "eval_time": "20m",
                    "alertname": "gpu_memory_high",
                    "exp_alerts": [alert("gpu_memory_high", {"gpu": "0"}, "gpu0: memory 95% used")],
                },
                {
                    "eval_time": "20m",
                    "alertname": "split_traffic_outside_rollout",
                    "exp_alerts": [
                        alert(
                            "split_traffic_outside_rollout",
                            {"model": "mlp"},
                            "mlp: 2 versions take traffic with no rollout in progress",
                        )
                    ],
                },
                # No process reports readiness at all: that is an outage, not silence.
                {
                    "eval_time": "20m",
                    "alertname": "engine_not_ready",
                    "exp_alerts": [alert("engine_not_ready", {}, annotations["engine_not_ready"]["summary"])],
                },
                {"eval_time": "20m", "alertname": "high_timeout_rate", "exp_alerts": []},
            ],
        },  # fmt: skip
        {
            "interval": "1m",
            "input_series": healthy,
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": name, "exp_alerts": []}
                for name in ("high_error_rate", "engine_not_ready", "queue_near_limit", "split_traffic_outside_rollout")
            ],
        },
    ]
    shutil.copy(prometheus.OUTPUT, tmp_path / "rules.yml")
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")

    result = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False, timeout=60
    )

    assert result.returncode == 0, result.stdout + result.stderr
