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
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from alerts.states import Severity
from serving.declared import Declared, Problem, describe, message

# Metrics the evaluator computes besides the history's own (controlplane.history.query.METRICS).
LIVE_METRICS = {
    "engine_ready": "1 when every serving process reports ready, else 0",
    "queue_fill": "largest queue depth over the queue limit, 0..1",
    "gpu_memory_fill": "GPU memory used over total, 0..1",
    "versions_live": "versions of a model taking traffic while no rollout is in progress",
    "auto_rollbacks": "automatic rollbacks in the window",
    "notification_failures": "failed delivery attempts of alert notifications made in the window or still retrying",
    "drift_score": "Jensen-Shannon divergence (bits, 0..1) of a version's predicted labels or a sampled input feature "
    "over the window against the version's reference window (a drift rule; group by feature)",
}
# A drift rule: its metric is scored per version and per `feature` ('predictions:<output>' or
# 'input:<feature>', controlplane.history.drift) over the window's merged counts, so its aggregation is
# `avg` (one score over the window), and `min_samples` is the fewest samples on both sides to judge by.
DRIFT_METRIC = "drift_score"
# Metrics measured over requests: a condition on one may set `min_requests`, the fewest requests in its
# window to judge by (below it the alert reports "not enough traffic": one failure in two is no rate).
REQUEST_METRICS = frozenset(
    {"error_rate", "client_error_rate", "timeout_rate", "rejection_rate", "p50", "p90", "p99", "p999", "latency_mean"}
)
Aggregation = Literal["avg", "max", "min", "sum", "last"]
Operator = Literal[">", ">=", "<", "<=", "==", "!="]
# reason: a client error's kind; feature: what a drift score is about (predictions:<output>, input:<feature>)
Grouping = Literal["model", "version", "slot", "device", "reason", "feature"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
OPERATORS: tuple[str, ...] = get_args(Operator)
GROUPINGS: tuple[str, ...] = get_args(Grouping)
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

# libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents, ~10x faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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
    # Fewest MiB the process must hold (its reserved memory, averaged over the window) before its
    # fragmentation is judged (`fragmentation` only): a small process's share of idle memory is its fixed
    # overhead and its warm-up arena, wasting nothing worth a compaction.
    min_reserved_mib: int = 0
    min_samples: int = 0  # drift rules: fewest samples in the window and in the reference; 0: the default (50)

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


# --- the rule file's schema ---------------------------------------------------------------------------
# Validated by the pydantic models below (serving.declared: strict types, unknown fields named), then
# turned into the frozen dataclasses above; what the evaluator reads never sees a raw mapping.


def _duration(value: Any) -> timedelta:
    if not isinstance(value, str) or not _DURATION.match(value):
        raise Problem(f"must be a duration like 30s, 5m, 2h or 1d, not {value!r}")
    return parse_duration(value, "")


Duration = Annotated[timedelta, BeforeValidator(_duration)]
Name = Annotated[str, Field(pattern=_NAME.pattern)]
Text = Annotated[str, Field(min_length=1)]


def _text_mapping(value: Any) -> dict[str, str]:
    """A mapping of names to text (labels, runbook parameters); a value that is not text is written as text."""
    if not value:  # left empty (`labels:`), as the hand-written checks read it: `value or {}`
        return {}
    if not isinstance(value, dict):
        raise Problem(f"must be a mapping, not {value!r:.100}")
    return {str(k): str(v) for k, v in value.items()}


TextMapping = Annotated[dict[str, str], BeforeValidator(_text_mapping)]


class _Condition(Declared):
    metric: str
    aggregation: Aggregation = "avg"
    window: Duration = timedelta(minutes=5)
    op: Operator
    threshold: float
    by: list[Grouping] = Field(default_factory=list)
    min_requests: Annotated[int, Field(ge=0)] = 0
    min_reserved_mib: Annotated[int, Field(ge=0)] = 0
    min_samples: Annotated[int, Field(ge=0)] = 0

    @field_validator("by", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        # NOTE: as the hand-written checks read it (`tuple(by)`): a mapping gives its keys, text its letters.
        return list(value) if isinstance(value, dict | str) else value

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str, info: ValidationInfo) -> str:
        known = sorted(info.context["metrics"])
        if metric not in known:
            raise Problem(f"unknown metric {metric!r}; known: {known}")
        return metric

    @model_validator(mode="after")
    def _requests_only(self) -> _Condition:
        if self.min_requests and self.metric not in REQUEST_METRICS:
            raise Problem(f"applies only to metrics over requests: {sorted(REQUEST_METRICS)}", at=("min_requests",))
        if self.min_reserved_mib and self.metric != "fragmentation":
            raise Problem("applies only to 'fragmentation'", at=("min_reserved_mib",))
        if "reason" in self.by and (self.metric != "client_error_rate" or self.aggregation != "avg"):
            raise Problem("'reason' applies only to client_error_rate with aggregation avg", at=("by",))
        if "feature" in self.by and self.metric != DRIFT_METRIC:
            raise Problem(f"'feature' applies only to {DRIFT_METRIC}", at=("by",))
        if self.min_samples and self.metric != DRIFT_METRIC:
            raise Problem(f"applies only to {DRIFT_METRIC}", at=("min_samples",))
        if self.metric == DRIFT_METRIC and self.aggregation != "avg":
            raise Problem("a drift score is one score over the window's merged counts: use avg", at=("aggregation",))
        return self


class _Automatic(Declared):
    # NOTE: as the hand-written checks it replaces: unknown keys ignored, `enabled` read as true or false
    # the way Python does, `max_attempts` as int() reads it. Tightening these would refuse files that load.
    model_config = ConfigDict(extra="ignore", strict=False)

    enabled: Any = False
    cooldown: Duration = timedelta(minutes=15)
    max_attempts: Any = 1

    @field_validator("max_attempts")
    @classmethod
    def _whole(cls, value: Any) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise Problem(f"must be a whole number, not {value!r:.100}") from None


class _Rule(Declared):
    name: Name
    severity: Severity
    why: str
    condition: _Condition
    for_: Duration = Field(timedelta(0), alias="for")
    labels: TextMapping = Field(default_factory=dict)
    summary: Text
    description: Any = ""
    runbook: str | None = None
    runbook_params: TextMapping = Field(default_factory=dict)
    automatic: Annotated[_Automatic | None, BeforeValidator(lambda value: value or None)] = None

    @field_validator("severity", mode="before")
    @classmethod
    def _severity(cls, value: Any) -> Severity:
        try:
            return Severity(value)
        except ValueError:
            raise Problem(f"must be P0, P1 or P2, not {value!r:.100}") from None

    @field_validator("why")
    @classmethod
    def _says_why(cls, why: str) -> str:
        if not why.strip():
            raise Problem("must say why this severity was chosen")
        return why.strip()

    @field_validator("runbook")
    @classmethod
    def _registered(cls, runbook: str | None, info: ValidationInfo) -> str | None:
        runbooks = info.context.get("runbooks")
        if runbook is not None and runbooks is not None and runbook not in set(runbooks):
            raise Problem(f"runbook {runbook!r} is not a registered runbook")
        return runbook

    @model_validator(mode="after")
    def _runnable(self) -> _Rule:
        if self.automatic is not None and self.automatic.enabled and self.runbook is None:
            raise Problem("needs a 'runbook' to run", at=("automatic",))
        return self

    def rule(self, source: str) -> Rule:
        auto = self.automatic or _Automatic()
        c = self.condition
        return Rule(
            name=self.name,
            severity=self.severity,
            why=self.why,
            condition=Condition(
                c.metric,
                c.aggregation,
                c.window,
                c.op,
                float(c.threshold),
                tuple(c.by),
                c.min_requests,
                c.min_reserved_mib,
                c.min_samples,
            ),
            for_=self.for_,
            summary=self.summary,
            description=str(self.description),
            labels=self.labels,
            runbook=self.runbook,
            runbook_params=self.runbook_params,
            automatic=Automatic(enabled=bool(auto.enabled), cooldown=auto.cooldown, max_attempts=auto.max_attempts),
            source=source,
        )


def item(kind: str, data: Any, pattern: re.Pattern[str], index: int | None) -> str:
    """Name one entry of a file's list: `rule 'high_p99'` by its name when it has one, else `rules[3]`."""
    name = data.get("name") if isinstance(data, dict) else None
    if isinstance(name, str) and pattern.match(name):
        return f"{kind} {name!r}"
    return f"{kind}s[{index}]" if index is not None else kind


def parse_rule(
    data: Any, source: str, metrics: Iterable[str], runbooks: Iterable[str] | None = None, index: int | None = None
) -> Rule:
    """Validate one `rules:` entry of file `source`; raise RuleError naming the file, the rule and the field."""
    context = {"metrics": list(metrics), "runbooks": None if runbooks is None else list(runbooks)}
    try:
        checked = _Rule.model_validate(data, context=context)
    except ValidationError as exc:
        raise RuleError(describe(exc, source, item("rule", data, _NAME, index))) from None
    # NOTE: `source` keeps the form `<file>[<index>] rule <name>`: dashboards.prometheus groups by its file.
    return checked.rule(
        f"{source}[{index}] rule {checked.name}" if index is not None else f"{source} rule {checked.name}"
    )


def load_rules(folder: Path, metrics: Iterable[str], runbooks: Iterable[str] | None = None) -> list[Rule]:
    """Load and validate every `*.yaml` in `folder`; raise RuleError naming the first problem."""
    metrics = list(metrics)
    rules: list[Rule] = []
    taken: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            documents = yaml.load(path.read_text(), Loader=SAFE_LOADER)
        except yaml.YAMLError as exc:
            raise RuleError(message(path.name, f"is not valid YAML: {exc}")) from None
        if isinstance(documents, dict) and "slos" in documents and "rules" not in documents:
            continue  # a file of SLOs only: alerts.slo reads it and generates their rules
        if not isinstance(documents, dict):
            raise RuleError(message(path.name, "must be a mapping with a 'rules' list"))
        if not isinstance(documents.get("rules"), list):
            raise RuleError(message(path.name, "must be a list of rules", path="rules"))
        for i, data in enumerate(documents["rules"]):
            rules.append(parse_rule(data, path.name, metrics, runbooks, i))
            unique(taken, rules[-1].name, path.name, "rule", i)
    return rules


def unique(taken: dict[str, str], name: str, source: str, kind: str, index: int) -> None:
    """Refuse a name that an earlier entry of the folder's files took (`taken`: name -> where); else take it."""
    if name in taken:
        raise RuleError(message(source, f"is already taken by {taken[name]}", item=f"{kind} {name!r}", path="name"))
    taken[name] = f"{source} {kind}s[{index}]"
