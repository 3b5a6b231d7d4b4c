"""The alert lifecycle as a pure function: observations in, state changes and notifications out.

inactive -> pending (condition holds) -> firing (held for the rule's `for`) -> resolved (no longer
holds). A firing alert is notified once, then again every repeat interval unless acknowledged;
silences and inhibition (a firing P0 on a model mutes its P1/P2) suppress notifications, never
state, so the timeline stays complete.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from alerts.rules import Rule
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
    """One evaluation's result: the new states, and what to tell people."""

    tracked: dict[str, Tracked] = field(default_factory=dict)
    notify: list[tuple[Tracked, str]] = field(default_factory=list)  # (alert, 'firing' | 'resolved')
    suppressed: list[tuple[Tracked, str]] = field(default_factory=list)  # (alert, why)
    changed: list[Tracked] = field(default_factory=list)  # state changes, for the timeline


def evaluate(
    rule: Rule,
    observations: dict[tuple[tuple[str, str], ...], float],
    previous: dict[str, Tracked],
    now: datetime,
) -> list[Tracked]:
    """Advance one rule's alerts: one per observed label set, plus any still tracked but unobserved."""
    result = []
    seen = set()
    for key, value in observations.items():
        labels = {**rule.labels, **dict(key), "alertname": rule.name, "severity": rule.severity.value}
        fp = fingerprint(rule.name, labels)
        seen.add(fp)
        old = previous.get(fp) or Tracked(fp, rule.name, rule.severity, labels, AlertState.INACTIVE)
        result.append(_advance(old, rule, rule.condition.holds(value), value, now))
    for fp, old in previous.items():
        if old.rule == rule.name and fp not in seen:  # no data any more: treat as not holding
            result.append(_advance(old, rule, False, None, now))
    return result


def _advance(old: Tracked, rule: Rule, holds: bool, value: float | None, now: datetime) -> Tracked:
    state = old.state
    if holds:
        if state in (AlertState.INACTIVE, AlertState.RESOLVED):
            old = replace(old, state=AlertState.PENDING, pending_since=now, resolved_at=None, acknowledged_by=None)
        if old.state is AlertState.PENDING and now - old.pending_since >= rule.for_:
            old = replace(old, state=AlertState.FIRING, firing_since=now, last_notified_at=None)
        return replace(old, value=value)
    if state is AlertState.FIRING:
        # NOTE: a series that vanished (no traffic any more) keeps its last value for the message.
        return replace(old, state=AlertState.RESOLVED, resolved_at=now, value=old.value if value is None else value)
    if state is AlertState.PENDING:
        return replace(old, state=AlertState.INACTIVE, pending_since=None, value=value)
    return replace(old, value=value) if value is not None else old


def decide(
    alerts: list[Tracked],
    before: dict[str, Tracked],
    silences: list[Silence],
    now: datetime,
    repeat_interval: timedelta,
) -> Decision:
    """Choose notifications for advanced alerts: new firings, repeats due, resolutions; apply mutes."""
    decision = Decision(tracked={a.fingerprint: a for a in alerts})
    p0_models = {a.labels.get("model") for a in alerts if a.state is AlertState.FIRING and a.severity is Severity.P0}
    for alert in alerts:
        old = before.get(alert.fingerprint)
        if old is None or old.state is not alert.state:
            decision.changed.append(alert)
        kind = None
        if alert.state is AlertState.FIRING:
            due = alert.last_notified_at is None or (
                alert.acknowledged_by is None and now - alert.last_notified_at >= repeat_interval
            )
            kind = "firing" if due else None
        elif alert.state is AlertState.RESOLVED and old is not None and old.state is AlertState.FIRING:
            kind = "resolved"
        if kind is None:
            continue
        why = None
        if any(s.mutes(alert.labels, now) for s in silences):
            why = "silenced"
        elif alert.severity is not Severity.P0 and alert.labels.get("model") in p0_models - {None}:
            why = "inhibited by a firing P0 on the same model"
        if why and kind == "firing":
            decision.suppressed.append((alert, why))
            continue
        if kind == "firing":
            alert = replace(alert, last_notified_at=now)
            decision.tracked[alert.fingerprint] = alert
        decision.notify.append((alert, kind))
    return decision


def group_key(alert: Tracked, by: tuple[str, ...] = ("alertname", "model")) -> str:
    """Alerts with equal values of `by` go out in one notification."""
    return "{" + ",".join(f'{k}="{alert.labels.get(k, "")}"' for k in by) + "}"
