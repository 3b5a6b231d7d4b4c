"""The alert lifecycle as a pure function: observations in, state changes and notifications out.

inactive -> pending (condition holds) -> firing (held for the rule's `for`) -> resolved (no longer
holds). Silences and inhibition (a firing P0 on a model mutes its P1/P2) mute notifications, never
state, so the timeline stays complete; they mute an alert by its labels whatever its state, as
Alertmanager's mute stages do (a resolved alert under a silence is not told either); when and to whom notifications go is `alerts.dispatch`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from alerts.rules import Insufficient, Rule
from alerts.states import AlertState, Severity

Labels = dict[str, str]


def fingerprint(rule_name: str, labels: Labels) -> str:
    """Identify an alert by its rule and labels (stable across processes and restarts)."""
    blob = json.dumps([rule_name, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tracked:
    """What is remembered about one alert between evaluations."""

    fingerprint: str
    rule: str
    severity: Severity
    labels: Labels
    state: AlertState
    value: float | None = None
    pending_since: datetime | None = None
    firing_since: datetime | None = None
    resolved_at: datetime | None = None
    last_notified_at: datetime | None = None
    acknowledged_by: str | None = None
    reason: str = ""  # why the condition does not hold now (back within it, no data, too little traffic)


@dataclass(frozen=True)
class Matcher:
    """`label` equals `value`, or matches it as a regular expression when `regex` is set."""

    label: str
    value: str
    regex: bool = False

    def matches(self, labels: Labels) -> bool:
        actual = labels.get(self.label)
        if actual is None:
            return False
        return re.fullmatch(self.value, actual) is not None if self.regex else actual == self.value


@dataclass(frozen=True)
class Silence:
    matchers: tuple[Matcher, ...]
    starts_at: datetime
    ends_at: datetime

    def mutes(self, labels: Labels, now: datetime) -> bool:
        return self.starts_at <= now < self.ends_at and all(m.matches(labels) for m in self.matchers)


@dataclass
class Decision:
    """One evaluation's result: the new states, which alerts are muted and why (any state), what changed."""

    tracked: dict[str, Tracked] = field(default_factory=dict)
    muted: dict[str, str] = field(default_factory=dict)  # fingerprint -> why its notifications are suppressed
    changed: list[Tracked] = field(default_factory=list)  # state changes, for the timeline


def evaluate(
    rule: Rule,
    observations: dict[tuple[tuple[str, str], ...], float | Insufficient],
    previous: dict[str, Tracked],
    now: datetime,
) -> list[Tracked]:
    """Advance one rule's alerts: one per observed label set, plus any still tracked but unobserved.

    An `Insufficient` observation (too few requests to judge) never holds; neither does a label set
    no longer observed at all. Either way the alert's value is None and its `reason` says why.
    """
    result = []
    seen = set()
    for key, value in observations.items():
        labels = {**rule.labels, **dict(key), "alertname": rule.name, "severity": rule.severity.value}
        fp = fingerprint(rule.name, labels)
        seen.add(fp)
        old = previous.get(fp) or Tracked(fp, rule.name, rule.severity, labels, AlertState.INACTIVE)
        result.append(_advance(old, rule, value, now))
    for fp, old in previous.items():
        if old.rule == rule.name and fp not in seen:  # no data any more: treat as not holding
            result.append(_advance(old, rule, None, now))
    return result


def _advance(old: Tracked, rule: Rule, seen: float | Insufficient | None, now: datetime) -> Tracked:
    state = old.state
    value = None if seen is None or isinstance(seen, Insufficient) else float(seen)
    if value is not None and rule.condition.holds(value):
        if state in (AlertState.INACTIVE, AlertState.RESOLVED):
            old = replace(old, state=AlertState.PENDING, pending_since=now, resolved_at=None, acknowledged_by=None)
        if old.state is AlertState.PENDING and now - old.pending_since >= rule.for_:
            old = replace(old, state=AlertState.FIRING, firing_since=now, last_notified_at=None)
        return replace(old, value=value, reason="")
    if isinstance(seen, Insufficient):
        reason = seen.reason
    else:
        reason = rule.no_data() if value is None else rule.recovered(value)
    if state is AlertState.FIRING:
        # NOTE: the value now (None without data) and why, never the last firing value: a RESOLVED
        # message must not say "50% of requests fail" when it resolved because traffic stopped.
        return replace(old, state=AlertState.RESOLVED, resolved_at=now, value=value, reason=reason)
    if state is AlertState.PENDING:
        return replace(old, state=AlertState.INACTIVE, pending_since=None, value=value, reason=reason)
    return replace(old, value=value, reason=reason)


INHIBITED = "inhibited by a firing P0 on the same model"


def inhibiting_models(alerts: Iterable[Tracked]) -> frozenset[str]:
    """The models with a firing P0: the sources of the one inhibit rule (P0 -> P1|P2, equal `model`)."""
    return frozenset(
        a.labels["model"]
        for a in alerts
        if a.state is AlertState.FIRING and a.severity is Severity.P0 and a.labels.get("model")
    )


def mute_reason(labels: Labels, silences: Iterable[Silence], p0_models: frozenset[str], now: datetime) -> str | None:
    """Why an alert with these labels is muted now (a silence, then inhibition), or None.

    As Alertmanager's MuteStages: the labels alone decide, whatever the alert's state, so a resolved
    alert under a silence is muted too. The inhibit rule is Alertmanager's `source_matchers:
    [severity="P0", model=~".+"]`, `target_matchers: [severity=~"P1|P2", model=~".+"]`, `equal: [model]`.
    """
    if any(s.mutes(labels, now) for s in silences):
        return "silenced"
    if labels.get("severity") in ("P1", "P2") and labels.get("model") in p0_models:
        return INHIBITED
    return None


def decide(alerts: list[Tracked], before: dict[str, Tracked], silences: list[Silence], now: datetime) -> Decision:
    """Record state changes and mute the alerts (firing or not) that a silence or a firing P0 covers.

    A state change is a change from the remembered state; an alert seen for the first time counts only
    when it is not inactive, so a first evaluation records (and logs) only what really holds.
    """
    decision = Decision(tracked={a.fingerprint: a for a in alerts})
    p0_models = inhibiting_models(alerts)
    for alert in alerts:
        old = before.get(alert.fingerprint)
        if (old is None and alert.state is not AlertState.INACTIVE) or (
            old is not None and old.state is not alert.state
        ):
            decision.changed.append(alert)
        if alert.state is AlertState.INACTIVE:
            continue
        why = mute_reason(alert.labels, silences, p0_models, now)
        if why is not None:
            decision.muted[alert.fingerprint] = why
    return decision
