"""Alertmanager's notification model, pure: routes, aggregation groups, and when a group is flushed.

Each receiver is a route under an implicit root (Alertmanager's `routes:` with `continue: true`):
its severities and label matchers pick the alerts, `group_by` splits them into groups, and every
group is one notification carrying all of its alerts. A group waits `group_wait` after its first
alert, is looked at again every `group_interval`, and is sent when it holds a firing alert the
receiver was not told about (or told at a lower severity), when an alert the receiver was told
is firing has stopped firing, or when `repeat_interval` passed with unacknowledged alerts still
firing (Alertmanager's `DedupStage.needsUpdate`). The group's status is firing while any of its
alerts fires, so a consumer never sees `resolved` for a group that still has a firing alert.

Silenced and inhibited alerts are left out (`muted`); an alert the receiver was never told about
never reaches it as resolved either. Keys are written as Alertmanager writes them:
`{}/{severity=~"P0|P1"}:{alertname="high_error_rate", model="mlp"}` (route key, then the group's
label set), see dispatch/route.go `Route.Key` and dispatch.go `aggrGroup.GroupKey`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from alerts.lifecycle import Matcher, Tracked
from alerts.states import AlertState

GROUP_WAIT = timedelta(seconds=30)  # Alertmanager's defaults
GROUP_INTERVAL = timedelta(minutes=5)
REPEAT_INTERVAL = timedelta(hours=4)
GROUP_BY = ("alertname",)


def go_quote(text: str) -> str:
    """Quote a string as Go's strconv.Quote does (how a LabelSet writes its values)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def label_set(labels: Mapping[str, str]) -> str:
    """Write labels as Prometheus' LabelSet.String: sorted, `{a="1", b="2"}`."""
    return "{" + ", ".join(f"{name}={go_quote(labels[name])}" for name in sorted(labels)) + "}"


def _matcher_text(matcher: Matcher) -> str:
    # NOTE: Alertmanager's Matcher.String escapes only backslash, quote and newline in the value.
    value = matcher.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{matcher.label}{"=~" if matcher.regex else "="}"{value}"'


@dataclass(frozen=True)
class Route:
    """One receiver's route: which alerts it takes and how it groups and paces them."""

    receiver: str
    severities: tuple[str, ...]
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] = GROUP_BY
    group_wait: timedelta = GROUP_WAIT
    group_interval: timedelta = GROUP_INTERVAL
    repeat_interval: timedelta = REPEAT_INTERVAL

    def takes(self, alert: Tracked) -> bool:
        """Say whether the alert's severity and labels match this route."""
        return alert.severity.value in self.severities and all(m.matches(alert.labels) for m in self.matchers)

    @property
    def key(self) -> str:
        """The route's key as Alertmanager writes it: the root `{}`, then this route's matchers."""
        severity = Matcher("severity", "|".join(self.severities), regex=True)
        return "{}/{" + ",".join(_matcher_text(m) for m in (severity, *self.matchers)) + "}"

    def group_labels(self, alert: Tracked) -> dict[str, str]:
        """The alert's values of `group_by` (labels it lacks are left out, as in Alertmanager)."""
        return {name: alert.labels[name] for name in self.group_by if name in alert.labels}

    def group_key(self, alert: Tracked) -> str:
        """The key of the group the alert falls in: route key, colon, the group's label set."""
        return f"{self.key}:{label_set(self.group_labels(alert))}"


@dataclass(frozen=True)
class Group:
    """What is remembered of one aggregation group between evaluations."""

    receiver: str
    key: str
    labels: Mapping[str, str]
    next_flush_at: datetime
    last_notified_at: datetime | None = None
    notified: Mapping[str, str] = field(default_factory=dict)  # fingerprint -> severity the receiver was told firing


@dataclass(frozen=True)
class Flush:
    """One notification to queue: a group's firing alerts and the ones the receiver must hear resolved."""

    receiver: str
    key: str
    labels: Mapping[str, str]
    firing: tuple[Tracked, ...]
    resolved: tuple[Tracked, ...]

    @property
    def status(self) -> str:
        """Firing while any alert in the group fires."""
        return "firing" if self.firing else "resolved"


def dispatch(
    routes: Iterable[Route],
    alerts: Iterable[Tracked],
    muted: Mapping[str, str],
    groups: Mapping[tuple[str, str], Group],
    now: datetime,
) -> tuple[dict[tuple[str, str], Group | None], list[Flush]]:
    """Advance every group: the groups to store (None: delete) and the notifications to queue now."""
    alerts = list(alerts)
    by_fp = {a.fingerprint: a for a in alerts}
    firing: dict[tuple[str, str], list[Tracked]] = {}
    labels: dict[tuple[str, str], dict[str, str]] = {}
    route_of: dict[str, Route] = {}
    for route in routes:
        route_of[route.receiver] = route
        for alert in alerts:
            if alert.state is AlertState.FIRING and alert.fingerprint not in muted and route.takes(alert):
                ident = (route.receiver, route.group_key(alert))
                firing.setdefault(ident, []).append(alert)
                labels.setdefault(ident, route.group_labels(alert))
    updated: dict[tuple[str, str], Group | None] = {}
    flushes: list[Flush] = []
    for ident in sorted(set(firing) | set(groups)):
        route = route_of.get(ident[0])
        group = groups.get(ident)
        if route is None:  # the receiver is gone: so is its group
            if group is not None:
                updated[ident] = None
            continue
        now_firing = sorted(firing.get(ident, []), key=lambda a: a.fingerprint)
        if group is None:
            group = Group(ident[0], ident[1], labels[ident], next_flush_at=now + route.group_wait)
            updated[ident] = group
        if now < group.next_flush_at:
            continue
        flush, group = _flush(route, group, now_firing, by_fp, now)
        if flush is not None:
            flushes.append(flush)
        updated[ident] = None if not now_firing and not group.notified else group
    return updated, flushes


def _flush(
    route: Route, group: Group, firing: list[Tracked], by_fp: Mapping[str, Tracked], now: datetime
) -> tuple[Flush | None, Group]:
    firing_fps = {a.fingerprint for a in firing}
    # Told firing and no longer firing: the receiver must hear it resolved. Still firing but muted
    # (or moved to another group): kept, so that its end is told once it shows up resolved.
    ended = [by_fp[fp] for fp in sorted(group.notified) if fp in by_fp and by_fp[fp].state is not AlertState.FIRING]
    kept = {
        fp: severity
        for fp, severity in group.notified.items()
        if fp in by_fp and fp not in firing_fps and by_fp[fp].state is AlertState.FIRING
    }
    news = any(group.notified.get(a.fingerprint) != a.severity.value for a in firing)
    repeat = (
        bool(firing)
        and group.last_notified_at is not None
        and now - group.last_notified_at >= route.repeat_interval
        and any(a.acknowledged_by is None for a in firing)
    )
    group = replace(group, next_flush_at=now + route.group_interval)
    if not (news or ended or repeat):
        return None, replace(group, notified={**kept, **{fp: group.notified[fp] for fp in firing_fps}})
    notified = {**kept, **{a.fingerprint: a.severity.value for a in firing}}
    flush = Flush(group.receiver, group.key, dict(group.labels), tuple(firing), tuple(ended))
    return flush, replace(group, notified=notified, last_notified_at=now)
