"""Alert rules from YAML: a small declarative condition over the history and live gauges, no eval.

name: high_error_rate
severity: P1
why: users see failures but most requests still succeed
condition: {metric: error_rate, aggregation: avg, window: 5m, op: ">", threshold: 0.05, by: [model, version],
            min_requests: 20}
for: 2m
labels: {team: ml}
summary: "{model} v{version}: error rate {value:.1%}"
runbook: rollback
automatic: {enabled: true, cooldown: 15m, max_attempts: 2}
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from alerts.states import Severity

# Metrics the evaluator computes besides the history's own (controlplane.history.query.METRICS).
LIVE_METRICS = {
    "engine_ready": "1 when every serving process reports ready, else 0",
    "queue_fill": "largest queue depth over the queue limit, 0..1",
    "gpu_memory_fill": "GPU memory used over total, 0..1",
    "versions_live": "versions of a model taking traffic while no rollout is in progress",
    "auto_rollbacks": "automatic rollbacks in the window",
    "notification_failures": "failed delivery attempts of alert notifications made in the window or still retrying",
}
# Metrics measured over requests: a condition on one may set `min_requests`, the fewest requests in its
# window to judge by (below it the alert reports "not enough traffic": one failure in two is no rate).
REQUEST_METRICS = frozenset(
    {"error_rate", "client_error_rate", "timeout_rate", "rejection_rate", "p50", "p90", "p99", "p999", "latency_mean"}
)
AGGREGATIONS = ("avg", "max", "min", "sum", "last")
OPERATORS = (">", ">=", "<", "<=", "==", "!=")
GROUPINGS = ("model", "version", "slot", "device")
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class RuleError(ValueError):
    """A rule file is wrong; the message names the file, the rule and the field."""


def parse_duration(value: Any, where: str) -> timedelta:
    """Parse '30s', '5m', '2h', '1d'."""
    match = _DURATION.match(str(value))
    if not match:
        raise RuleError(f"{where}: duration must look like 30s, 5m, 2h or 1d, not {value!r}")
    amount, unit = int(match.group(1)), match.group(2)
    return timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: amount})


def duration_text(duration: timedelta) -> str:
    """Write a duration as rule files do: `30s`, `5m`, `2h`, `1d`."""
    seconds = int(duration.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Insufficient:
    """An observed label set with too little behind it to judge the condition; `reason` says so."""

    reason: str


def too_little_traffic(requests: int, needed: int, window: timedelta) -> Insufficient:
    """Say that `requests` in `window` are fewer than the `needed` to judge by (rules and SLOs alike)."""
    noun = "request" if requests == 1 else "requests"
    return Insufficient(
        f"not enough traffic: {requests} {noun} in {duration_text(window)}, fewer than the {needed} needed"
    )


class _Labels(dict):
    """A template's fields: a missing one renders as '?'.

    NOTE: declared once here; declared inside `render`, a new class was built on every call (each
    alert's summary and description, every evaluation): about 1 KB held in reference cycles until the
    collector ran, and dict's subclass registry growing with them.
    """

    def __missing__(self, key: str) -> str:
        return "?"


class _NoValue:
    """Stands in for a missing value in a template: every format spec renders `n/a`, never `nan%`."""

    def __format__(self, spec: str) -> str:
        return "n/a"


@dataclass(frozen=True)
class Condition:
    metric: str
    aggregation: str
    window: timedelta
    op: str
    threshold: float
    by: tuple[str, ...]
    min_requests: int = 0  # fewest requests in the window to judge by (REQUEST_METRICS only); 0: no minimum

    def holds(self, value: float) -> bool:
        """Compare a value with the threshold."""
        t = self.threshold
        return {">": value > t, ">=": value >= t, "<": value < t, "<=": value <= t, "==": value == t, "!=": value != t}[
            self.op
        ]

    def too_little_traffic(self, requests: int) -> Insufficient:
        """Say that `requests` in the window are fewer than the condition needs to judge by."""
        return too_little_traffic(requests, self.min_requests, self.window)


@dataclass(frozen=True)
class Automatic:
    enabled: bool = False
    cooldown: timedelta = timedelta(minutes=15)
    max_attempts: int = 1


@dataclass(frozen=True)
class Rule:
    name: str
    severity: Severity
    why: str
    condition: Condition
    for_: timedelta
    summary: str
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    runbook: str | None = None
    runbook_params: dict[str, str] = field(default_factory=dict)
    automatic: Automatic = Automatic()
    source: str = ""

    def render(self, template: str, labels: dict[str, str], value: float | None) -> str:
        """Fill a summary/description template; a missing label renders as '?', a missing value as 'n/a'."""
        try:
            return template.format_map(_Labels(labels, value=_NoValue() if value is None else value))
        except (ValueError, TypeError):
            return template

    def format_value(self, value: float) -> str:
        """Write a value as the summary writes it (`{value:.1%}` gives `12.3%`), else in general form."""
        try:
            spec = next((s for _, name, s, _ in string.Formatter().parse(self.summary) if name == "value"), None)
            return format(value, spec) if spec else f"{value:g}"
        except ValueError:
            return f"{value:g}"

    def recovered(self, value: float) -> str:
        """Say why a value no longer holds the condition, e.g. `1.0%, no longer > 5.0%`."""
        c = self.condition
        return f"{self.format_value(value)}, no longer {c.op} {self.format_value(c.threshold)}"

    def no_data(self) -> str:
        """Say that nothing was observed in the window (traffic stopped, or nothing was sampled)."""
        return f"no data in the last {duration_text(self.condition.window)}: no traffic, or nothing sampled"


def _rule(data: Any, where: str, metrics: Iterable[str], runbooks: Iterable[str] | None) -> Rule:
    if not isinstance(data, dict):
        raise RuleError(f"{where}: each rule must be a mapping")
    allowed = {"name", "severity", "why", "condition", "for", "labels", "summary", "description", "runbook",
               "runbook_params", "automatic"}  # fmt: skip
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {unknown}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RuleError(f"{where}: 'name' must match {_NAME.pattern}")
    where = f"{where} rule {name}"
    try:
        severity = Severity(data.get("severity"))
    except ValueError:
        raise RuleError(f"{where}: 'severity' must be P0, P1 or P2") from None
    why = data.get("why")
    if not isinstance(why, str) or not why.strip():
        raise RuleError(f"{where}: 'why' must say why this severity was chosen")
    cond = data.get("condition")
    if not isinstance(cond, dict):
        raise RuleError(f"{where}: 'condition' must be a mapping")
    metric = cond.get("metric")
    known = sorted(metrics)
    if metric not in known:
        raise RuleError(f"{where}: unknown metric {metric!r}; known: {known}")
    aggregation = cond.get("aggregation", "avg")
    if aggregation not in AGGREGATIONS:
        raise RuleError(f"{where}: 'aggregation' must be one of {AGGREGATIONS}")
    op = cond.get("op")
    if op not in OPERATORS:
        raise RuleError(f"{where}: 'op' must be one of {OPERATORS}")
    threshold = cond.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise RuleError(f"{where}: 'threshold' must be a number")
    by = tuple(cond.get("by", ()))
    if any(b not in GROUPINGS for b in by):
        raise RuleError(f"{where}: 'by' may only name {GROUPINGS}")
    extra = sorted(set(cond) - {"metric", "aggregation", "window", "op", "threshold", "by", "min_requests"})
    if extra:
        raise RuleError(f"{where}: unknown condition field(s) {extra}")
    min_requests = cond.get("min_requests", 0)
    if isinstance(min_requests, bool) or not isinstance(min_requests, int) or min_requests < 0:
        raise RuleError(f"{where}: 'min_requests' must be a whole number of requests, 0 or more")
    if min_requests and metric not in REQUEST_METRICS:
        raise RuleError(f"{where}: 'min_requests' applies only to metrics over requests: {sorted(REQUEST_METRICS)}")
    runbook = data.get("runbook")
    if runbook is not None and runbooks is not None and runbook not in set(runbooks):
        raise RuleError(f"{where}: runbook {runbook!r} is not a registered runbook")
    auto = data.get("automatic") or {}
    if not isinstance(auto, dict):
        raise RuleError(f"{where}: 'automatic' must be a mapping")
    automatic = Automatic(
        enabled=bool(auto.get("enabled", False)),
        cooldown=parse_duration(auto.get("cooldown", "15m"), f"{where} automatic.cooldown"),
        max_attempts=int(auto.get("max_attempts", 1)),
    )
    if automatic.enabled and runbook is None:
        raise RuleError(f"{where}: 'automatic' needs a 'runbook' to run")
    summary = data.get("summary")
    if not isinstance(summary, str) or not summary:
        raise RuleError(f"{where}: 'summary' is required")
    return Rule(
        name=name,
        severity=severity,
        why=why.strip(),
        condition=Condition(
            metric=metric,
            aggregation=aggregation,
            window=parse_duration(cond.get("window", "5m"), f"{where} condition.window"),
            op=op,
            threshold=float(threshold),
            by=by,
            min_requests=min_requests,
        ),
        for_=parse_duration(data.get("for", "0s"), f"{where} for"),
        summary=summary,
        description=str(data.get("description", "")),
        labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        runbook=runbook,
        runbook_params={str(k): str(v) for k, v in (data.get("runbook_params") or {}).items()},
        automatic=automatic,
        source=where,
    )


def load_rules(folder: Path, metrics: Iterable[str], runbooks: Iterable[str] | None = None) -> list[Rule]:
    """Load and validate every `*.yaml` in `folder`; raise RuleError naming the first problem."""
    metrics = list(metrics)
    rules: list[Rule] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            documents = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise RuleError(f"{path.name}: not valid YAML: {exc}") from None
        if isinstance(documents, dict) and "slos" in documents and "rules" not in documents:
            continue  # a file of SLOs only: alerts.slo reads it and generates their rules
        if not isinstance(documents, dict) or not isinstance(documents.get("rules"), list):
            raise RuleError(f"{path.name}: expected a mapping with a 'rules' list")
        for i, data in enumerate(documents["rules"]):
            rules.append(_rule(data, f"{path.name}[{i}]", metrics, runbooks))
    names = [r.name for r in rules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RuleError(f"rule names must be unique; repeated: {duplicates}")
    return rules
