"""Alert rules: the default set loads; every mistake in a rule file is named."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, RuleError, load_rules, parse_duration
from alerts.states import Severity

RULES = Path(__file__).resolve().parents[2] / "alerts" / "rules"
KNOWN = [*METRICS, *LIVE_METRICS]
RUNBOOKS = ["rollback", "drain_reload", "compact_memory", "set_batching", "shed_load", "diagnostics", "check_drift"]


def test_the_default_rule_set_covers_what_the_issue_asks_and_says_why() -> None:
    rules = {r.name: r for r in load_rules(RULES, KNOWN, RUNBOOKS)}
    metrics = {r.condition.metric for r in rules.values()}
    assert {"engine_ready", "error_rate", "timeout_rate", "p99", "queue_fill", "rejection_rate", "gpu_memory_fill",
            "gpu_utilization", "fragmentation", "versions_live", "auto_rollbacks", "notification_failures", "drift_score"} <= metrics  # fmt: skip
    assert rules["engine_not_ready"].severity is Severity.P0
    assert all(len(r.why) > 20 for r in rules.values())
    assert all(r.runbook in RUNBOOKS for r in rules.values())
    drift = rules["model_drift"]
    assert drift.severity is Severity.P2 and drift.runbook == "check_drift" and "feature" in drift.condition.by
    rollback = rules["high_error_rate"]
    assert rollback.automatic.enabled and rollback.automatic.cooldown == timedelta(minutes=15)
    assert rollback.render(rollback.summary, {"model": "textcls", "version": "2"}, 0.123) == (
        "textcls v2: 12.3% of requests fail"
    )


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "x.yaml").write_text(body)
    return tmp_path


GOOD = """
rules:
  - name: r
    severity: P1
    why: because it matters to someone
    condition: {metric: p99, aggregation: max, window: 5m, op: ">", threshold: 100}
    for: 1m
    summary: s
    runbook: rollback
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("metric: p99", "metric: p98"), "rule 'r' field 'condition.metric': unknown metric 'p98'"),
        (("window: 5m", "window: five"), "rule 'r' field 'condition.window': must be a duration like 30s"),
        (("for: 1m", "for: 1w"), "rule 'r' field 'for': must be a duration like"),
        (
            ("runbook: rollback", "runbook: reboot_everything"),
            "field 'runbook': runbook 'reboot_everything' is not a registered runbook",
        ),
        (("severity: P1", "severity: P4"), "rule 'r' field 'severity': must be P0, P1 or P2"),
        (('op: ">"', 'op: "=>"'), "rule 'r' field 'condition.op': must be '>', '>=', '<', '<=', '==' or '!='"),
        (("threshold: 100", "threshold: high"), "rule 'r' field 'condition.threshold': must be a number"),
        (("threshold: 100", "threshold: true"), "rule 'r' field 'condition.threshold': must be a number"),
        (("why: because it matters to someone", "why: ' '"), "rule 'r' field 'why': must say why"),
        (("name: r", "name: R!"), "rules[0] field 'name': must match"),
        (("summary: s", "summry: s"), "rule 'r' field 'summry': is not a known field"),
        (("window: 5m", "window: 5m, by: [pod]"), "rule 'r' field 'condition.by[0]': must be 'model', 'version'"),
        (("window: 5m", "windw: 5m"), "rule 'r' field 'condition.windw': is not a known field"),
        (("summary: s", "summary: ''"), "rule 'r' field 'summary': must not be empty"),
        (("    summary: s\n", ""), "rule 'r' field 'summary': is required"),
    ],
)
def test_mistakes_are_refused_with_the_file_rule_and_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    folder = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(RuleError) as refused:
        load_rules(folder, KNOWN, RUNBOOKS)
    assert message in str(refused.value) and str(refused.value).startswith("x.yaml: ")


def test_broken_yaml_duplicates_and_automatic_without_runbook(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="x.yaml: is not valid YAML"):
        load_rules(write(tmp_path, "rules: [\n"), KNOWN, RUNBOOKS)
    with pytest.raises(RuleError, match=r"x.yaml: rule 'r' field 'name': is already taken by x.yaml rules\[0\]"):
        load_rules(write(tmp_path, GOOD + GOOD.replace("rules:\n", "")), KNOWN, RUNBOOKS)
    automatic = GOOD.replace("    runbook: rollback\n", "    automatic: {enabled: true}\n")
    with pytest.raises(RuleError, match="x.yaml: rule 'r' field 'automatic': needs a 'runbook'"):
        load_rules(write(tmp_path, automatic), KNOWN, RUNBOOKS)
    with pytest.raises(RuleError, match="x.yaml: field 'rules': must be a list of rules"):
        load_rules(write(tmp_path, "rules: {name: r}\n"), KNOWN, RUNBOOKS)
    with pytest.raises(RuleError, match="x.yaml: must be a mapping with a 'rules' list"):
        load_rules(write(tmp_path, "- r\n"), KNOWN, RUNBOOKS)
    assert parse_duration("90s", "x") == timedelta(seconds=90)


def test_min_reserved_mib_is_for_fragmentation_only(tmp_path: Path) -> None:
    rule = {"name": "x", "severity": "P2", "why": "w", "summary": "s", "for": "0s"}
    frag = {"metric": "fragmentation", "aggregation": "avg", "window": "5m", "op": ">", "threshold": 0.6}
    (tmp_path / "r.yaml").write_text(
        yaml.safe_dump({"rules": [rule | {"condition": frag | {"min_reserved_mib": 512}}]})
    )
    (loaded,) = load_rules(tmp_path, METRICS)
    assert loaded.condition.min_reserved_mib == 512
    for condition, message in (
        (frag | {"min_reserved_mib": -1}, "field 'condition.min_reserved_mib': must be at least 0, not -1"),
        (
            frag | {"metric": "rss", "min_reserved_mib": 5},
            "field 'condition.min_reserved_mib': applies only to 'fragmentation'",
        ),
    ):
        (tmp_path / "r.yaml").write_text(yaml.safe_dump({"rules": [rule | {"condition": condition}]}))
        with pytest.raises(RuleError, match=message):
            load_rules(tmp_path, METRICS)


def test_by_reason_is_for_the_client_error_rate_only(tmp_path: Path) -> None:
    rule = {"name": "x", "severity": "P2", "why": "w", "summary": "s", "for": "0s"}
    for condition in (
        {"metric": "error_rate", "window": "5m", "op": ">", "threshold": 0.1, "by": ["model", "reason"]},
        {"metric": "client_error_rate", "aggregation": "max", "window": "5m", "op": ">", "threshold": 0.1,
         "by": ["reason"]},
    ):  # fmt: skip
        (tmp_path / "r.yaml").write_text(yaml.safe_dump({"rules": [rule | {"condition": condition}]}))
        with pytest.raises(
            RuleError, match="field 'condition.by': 'reason' applies only to client_error_rate with aggregation avg"
        ):
            load_rules(tmp_path, METRICS)


DRIFT = """
rules:
  - name: drift
    severity: P2
    why: answers moved away from the reference
    condition: {metric: drift_score, aggregation: avg, window: 1h, op: ">", threshold: 0.1, by: [model, feature], min_samples: 80}
    summary: "{model}: {feature} drifted"
"""


def test_a_drift_rule_groups_by_feature_and_sets_its_fewest_samples(tmp_path: Path) -> None:
    (rule,) = load_rules(write(tmp_path, DRIFT), KNOWN, RUNBOOKS)
    assert rule.condition.by == ("model", "feature") and rule.condition.min_samples == 80
    refusals = {
        ("aggregation: avg", "aggregation: max"): "field 'condition.aggregation': a drift score is one score",
        ("metric: drift_score", "metric: error_rate"): "field 'condition.by': 'feature' applies only to drift_score",
    }
    for (old, new), wanted in refusals.items():
        with pytest.raises(RuleError, match=wanted):
            load_rules(write(tmp_path, DRIFT.replace(old, new)), KNOWN, RUNBOOKS)
    no_feature = DRIFT.replace("by: [model, feature], ", "by: [model], ").replace("drift_score", "error_rate")
    with pytest.raises(RuleError, match="field 'condition.min_samples': applies only to drift_score"):
        load_rules(write(tmp_path, no_feature), KNOWN, RUNBOOKS)
