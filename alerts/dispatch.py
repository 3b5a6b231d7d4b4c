"""Alertmanager's notification model, pure: routes, aggregation groups, and when a group is flushed.

Each receiver is a route under an implicit root (Alertmanager's `routes:` with `continue: true`):
its severities and label matchers pick the alerts, `group_by` splits them into groups, and every
group is one notification carrying all of its alerts. As Alertmanager 0.25 (dispatch/dispatch.go,
notify/notify.go): a group exists from its first alert's firing, muted or not; it ticks first
`group_wait` after that, then every `group_interval` from the previous tick; at each tick its
alerts (the firing ones, and the resolved ones it still holds) go through the mute stages
(silences and inhibition, by labels, whatever the state), and what is left is sent when
`DedupStage.needsUpdate` says so against the group's log entry: a firing alert not told firing
(or, Flightdeck's addition, told at a lower severity), no firing alert left after some were told,
a resolved alert not yet told resolved while others fire, or the repeat interval passed (with an
unacknowledged alert: Flightdeck's addition). Resolved alerts leave the group at every tick, told
or muted, so a silence that covers an alert's end means its end is never told. A message lists
every unmuted alert of the group, firing and resolved together, in Alertmanager's order
(`AlertSlice.Less`). Keys are written as Alertmanager writes them:
`{}/{model="mlp",severity=~"P0|P1"}:{alertname="high_error_rate", model="mlp"}` (route key with its
matchers sorted, then the group's label set), see dispatch/route.go `Route.Key` and dispatch.go
`aggrGroup.GroupKey`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cmp_to_key

from alerts.lifecycle import Matcher, Tracked
from alerts.states import AlertState

GROUP_WAIT = timedelta(seconds=30)  # Alertmanager's defaults
GROUP_INTERVAL = timedelta(minutes=5)
REPEAT_INTERVAL = timedelta(hours=4)
GROUP_BY = ("alertname",)
LOG_RETENTION = timedelta(hours=120)  # Alertmanager's --data.retention: how long its notification log lasts


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
        """The route's key as Alertmanager writes it: the root `{}`, then this route's matchers, sorted.

        Alertmanager sorts a route's matchers by name, then value, then type (`=` before `=~`;
        pkg/labels `Matchers.Less`) before `Route.Key` writes them.
        """
        severity = Matcher("severity", "|".join(self.severities), regex=True)
        ordered = sorted((severity, *self.matchers), key=lambda m: (m.label, m.value, 2 if m.regex else 0))
        return "{}/{" + ",".join(_matcher_text(m) for m in ordered) + "}"

    def group_labels(self, alert: Tracked) -> dict[str, str]:
        """The alert's values of `group_by` (labels it lacks are left out, as in Alertmanager)."""
        return {name: alert.labels[name] for name in self.group_by if name in alert.labels}

    def group_key(self, alert: Tracked) -> str:
        """The key of the group the alert falls in: route key, colon, the group's label set."""
        return f"{self.key}:{label_set(self.group_labels(alert))}"


@dataclass(frozen=True)
class Group:
    """One aggregation group between evaluations: the alerts it holds and its notification log entry.

    `held` are the alerts in the group (Alertmanager's per-group store): every firing alert the route
    takes, muted or not, from its first firing; a resolved one until the next flush. `notified`,
    `resolved` and `last_notified_at` are the group's entry in Alertmanager's notification log: what
    the last message said firing (with the severity) and resolved, and the tick it was made at
    (`last_notified_at` None: never told). A group holding nothing is dormant: kept for its entry,
    as Alertmanager keeps the log after the group is gone, and started afresh by its next alert.
    """

    receiver: str
    key: str
    labels: Mapping[str, str]
    next_flush_at: datetime
    last_notified_at: datetime | None = None
    notified: Mapping[str, str] = field(default_factory=dict)  # fingerprint -> severity, told firing
    resolved: frozenset[str] = frozenset()  # told resolved in the last message
    held: frozenset[str] = frozenset()
    flushed: bool = False  # flushed since its first alert (after that, only group_interval ticks)


@dataclass(frozen=True)
class Flush:
    """One notification to queue: every unmuted alert of the group, in Alertmanager's order, with its status."""

    receiver: str
    key: str
    labels: Mapping[str, str]
    alerts: tuple[tuple[Tracked, str], ...]  # (alert, "firing" | "resolved")
    at: datetime  # the group's tick

    @property
    def firing(self) -> tuple[Tracked, ...]:
        return tuple(a for a, status in self.alerts if status == "firing")

    @property
    def resolved(self) -> tuple[Tracked, ...]:
        return tuple(a for a, status in self.alerts if status == "resolved")

    @property
    def status(self) -> str:
        """Firing while any alert in the group fires."""
        return "firing" if self.firing else "resolved"


def label_set_before(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Prometheus' LabelSet.Before: fewer labels first, then name by name over both sets, sorted."""
    if len(a) != len(b):
        return len(a) < len(b)
    for name in sorted([*a, *b]):
        if name not in a:
            return True
        if name not in b:
            return False
        if a[name] != b[name]:
            return a[name] < b[name]
    return False


def _alert_before(a: Mapping[str, str], b: Mapping[str, str]) -> int:
    """Alertmanager's AlertSlice.Less as a comparison: `job`, then `instance` (present first), then the label sets."""
    for name in ("job", "instance"):
        if name not in a and name not in b:
            continue
        if name not in a:
            return 1
        if name not in b:
            return -1
        if a[name] != b[name]:
            return -1 if a[name] < b[name] else 1
    return -1 if label_set_before(a, b) else 1 if label_set_before(b, a) else 0


def alertmanager_order(alerts: Iterable[Tracked]) -> list[Tracked]:
    """Sort a group's alerts as Alertmanager lists them in a message (firing and resolved together)."""
    return sorted(alerts, key=cmp_to_key(lambda x, y: _alert_before(x.labels, y.labels)))


def dispatch(
    routes: Iterable[Route],
    alerts: Iterable[Tracked],
    muted: Mapping[str, str],
    groups: Mapping[tuple[str, str], Group],
    now: datetime,
) -> tuple[dict[tuple[str, str], Group | None], list[Flush]]:
    """Advance every group: the groups to store (None: delete) and the notifications to queue now.

    A group's ticks are exact: its first at creation + group_wait (at once when its first alert
    already waited that long, as Alertmanager's `aggrGroup.insert`), then every group_interval from
    the previous tick, whenever the evaluation that sees them runs.
    """
    alerts = list(alerts)
    by_fp = {a.fingerprint: a for a in alerts}
    members: dict[tuple[str, str], list[Tracked]] = {}
    labels: dict[tuple[str, str], dict[str, str]] = {}
    route_of: dict[str, Route] = {}
    for route in routes:
        route_of[route.receiver] = route
        for alert in alerts:
            # NOTE: muted or not: a group exists from its first alert's firing (Alertmanager mutes at the flush).
            if alert.state is AlertState.FIRING and route.takes(alert):
                ident = (route.receiver, route.group_key(alert))
                members.setdefault(ident, []).append(alert)
                labels.setdefault(ident, route.group_labels(alert))
    updated: dict[tuple[str, str], Group | None] = {}
    flushes: list[Flush] = []
    for ident in sorted(set(members) | set(groups)):
        route = route_of.get(ident[0])
        group = groups.get(ident)
        if route is None:  # the receiver is gone: so is its group
            if group is not None:
                updated[ident] = None
            continue
        group = _insert(route, group, ident, labels.get(ident, {}), members.get(ident, []), by_fp, now)
        if group.held and group.next_flush_at <= now:
            flush, group = _tick(route, group, by_fp, muted, now)
            if flush is not None:
                flushes.append(flush)
        # A dormant group is kept for its log entry as long as Alertmanager keeps its log (--data.retention).
        keep = group.held or (
            group.notified and group.last_notified_at is not None and now - group.last_notified_at < LOG_RETENTION
        )
        if keep:
            updated[ident] = group
        elif ident in groups:
            updated[ident] = None
    return updated, flushes


def _insert(
    route: Route,
    group: Group | None,
    ident: tuple[str, str],
    labels: Mapping[str, str],
    firing: list[Tracked],
    by_fp: Mapping[str, Tracked],
    now: datetime,
) -> Group:
    """Put the group's firing alerts in it, creating (or waking) it on its first one."""
    fps = {a.fingerprint for a in firing}
    if group is None or not group.held:
        if not fps:
            return group or Group(ident[0], ident[1], dict(labels), now)
        base = group or Group(ident[0], ident[1], dict(labels), now)
        group = replace(base, labels=dict(labels) or base.labels, next_flush_at=now + route.group_wait, flushed=False)
    # An alert that moved out (another group now, or no longer taken) leaves without a word.
    held = {fp for fp in group.held if fp in fps or (fp in by_fp and by_fp[fp].state is not AlertState.FIRING)}
    new = [a for a in firing if a.fingerprint not in group.held]
    next_flush_at = group.next_flush_at
    if not group.flushed and any(
        a.firing_since is not None and a.firing_since + route.group_wait < now for a in new
    ):  # its wait is already over: flush at once
        next_flush_at = min(next_flush_at, now)
    return replace(group, held=frozenset(held | fps), next_flush_at=next_flush_at)


def _tick(
    route: Route, group: Group, by_fp: Mapping[str, Tracked], muted: Mapping[str, str], now: datetime
) -> tuple[Flush | None, Group]:
    """One flush of the group at its tick: Alertmanager's mute stages, then DedupStage.needsUpdate.

    Ticks an evaluation came too late for (the evaluator stopped a while) fold into the latest one.
    """
    tick = group.next_flush_at
    if tick + route.group_interval <= now:
        tick += route.group_interval * ((now - tick) // route.group_interval)
    listed = [by_fp[fp] for fp in group.held if fp in by_fp and fp not in muted]
    firing = {a.fingerprint: a.severity.value for a in listed if a.state is AlertState.FIRING}
    resolved = frozenset(a.fingerprint for a in listed if a.state is not AlertState.FIRING)
    # Resolved alerts leave the group at every flush, told or not (a notify that did not fail).
    after = replace(
        group,
        next_flush_at=tick + route.group_interval,
        flushed=True,
        held=frozenset(fp for fp in group.held if fp in by_fp and by_fp[fp].state is AlertState.FIRING),
    )
    if not listed or not _needs_update(route, group, firing, resolved, listed, tick):
        return None, after
    ordered = alertmanager_order(listed)
    flush = Flush(
        group.receiver,
        group.key,
        dict(group.labels),
        tuple((a, "firing" if a.fingerprint in firing else "resolved") for a in ordered),
        tick,
    )
    return flush, replace(after, notified=firing, resolved=resolved, last_notified_at=tick)


def _needs_update(
    route: Route,
    group: Group,
    firing: Mapping[str, str],
    resolved: frozenset[str],
    listed: list[Tracked],
    tick: datetime,
) -> bool:
    """Alertmanager's DedupStage.needsUpdate over the group's log entry (webhooks send resolved)."""
    if group.last_notified_at is None:
        return bool(firing)
    # A firing alert not told firing, or told at another severity (Flightdeck's escalation), is news.
    if any(group.notified.get(fp) != severity for fp, severity in firing.items()):
        return True
    if not firing:
        return bool(group.notified)
    if not resolved <= group.resolved:
        return True
    # NOTE: strictly after, as Alertmanager's `Timestamp.Before(now - repeat)`: its log's timestamp is
    # taken after the send, a little after the tick, so a repeat equal to the ticks' spacing waits a tick.
    # Flightdeck's difference: acknowledged alerts are not repeated.
    return tick - group.last_notified_at > route.repeat_interval and any(
        a.acknowledged_by is None for a in listed if a.fingerprint in firing
    )
