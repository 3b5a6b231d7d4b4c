"""What a rule's condition sees: one value per label set, from the history and the live state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Row, case, func, or_, select
from sqlalchemy.orm import Session

from alerts.catalogue import DEVICE_METRICS, SLOT_METRICS
from alerts.rules import Insufficient, Rule
from alerts.slo import BurnRule
from controlplane.history.drift import STREAM_ROWS, drift_observation
from controlplane.history.query import SlotAggregate
from controlplane.history.slo import ClosedHours, burn_observation
from controlplane.models import AuditEvent, Deployment, DeviceSample, OutboxMessage, SlotSample
from controlplane.rollout.service import active_rollout
from controlplane.rollout.states import Slot

Key = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str], by: tuple[str, ...]) -> Key:
    return tuple((name, labels.get(name, "")) for name in by)


def _combine(values: list[float], aggregation: str) -> float | None:
    if not values:
        return None
    if aggregation == "max":
        return max(values)
    if aggregation == "min":
        return min(values)
    if aggregation == "sum":
        return sum(values)
    if aggregation == "last":
        return values[-1]
    return sum(values) / len(values)


class _SlotWindow:
    """One slot-metric rule's value, added up from the rows of its window as they stream by in time order."""

    def __init__(self, rule: Rule, now: datetime) -> None:
        self.rule = rule
        self.start = now - rule.condition.window
        self._merged: dict[Key, SlotAggregate] = defaultdict(SlotAggregate)  # "avg": the window as one aggregate
        # Otherwise one interval's aggregate per label set at a time, its value kept once the next interval begins.
        self._current: dict[Key, tuple[datetime, SlotAggregate]] = {}
        self._values: dict[Key, list[float]] = defaultdict(list)
        self._requests: dict[Key, int] = defaultdict(int)

    def add(self, row: Row[Any]) -> None:
        if row.ts <= self.start:
            return
        c = self.rule.condition
        key = _key({"model": row.model, "version": row.version, "slot": row.slot}, c.by)
        if c.aggregation == "avg":
            # NOTE: one aggregate over the window (errors / requests), not an average of per-interval ratios.
            self._merged[key].add_figures(row)
            return
        if key in self._current and self._current[key][0] != row.ts:
            self._close(key)
        if key not in self._current:
            self._current[key] = (row.ts, SlotAggregate())
        self._current[key][1].add_figures(row)

    def _close(self, key: Key) -> None:
        _, agg = self._current.pop(key)
        self._requests[key] += agg.requests
        if (value := agg.value(self.rule.condition.metric, 10.0)) is not None:
            self._values[key].append(value)

    def result(self) -> dict[Key, float | Insufficient]:
        rule, c = self.rule, self.rule.condition
        if c.aggregation == "avg":
            seconds = c.window.total_seconds()
            if "reason" in c.by:  # client errors of each kind over all the requests of the label set
                judged = {
                    _key({**dict(k), "reason": kind}, c.by): _judged(rule, agg.client_error_share(kind), agg.requests)
                    for k, agg in self._merged.items()
                    for kind in sorted(agg.client_error_kinds)
                }
            else:
                judged = {
                    k: _judged(rule, agg.value(c.metric, seconds), agg.requests) for k, agg in self._merged.items()
                }
            return {k: v for k, v in judged.items() if v is not None}
        for key in list(self._current):
            self._close(key)
        result = {}
        for key, total in self._requests.items():
            combined = _judged(rule, _combine(self._values[key], c.aggregation), total)
            if combined is not None:
                result[key] = combined
        return result


def slot_observations(session: Session, rules: list[Rule], now: datetime) -> dict[str, dict[Key, float | Insufficient]]:
    """The values of every slot-metric rule (SLOT_METRICS), by rule name, from one reading of the history.

    NOTE: streamed, and only the columns used (issue 29, item 8; no slot metric reads the compute histograms or
    the answers, the largest JSON of a row under traffic): whole ORM rows read at once made each
    evaluation's peak grow with the window's rows, and the lease holder's RSS with it. One stream for all
    the rules, from the earliest start: each rule read (and decoded the JSON of) its own window's rows before.
    """
    windows = [_SlotWindow(rule, now) for rule in rules]
    if not windows:
        return {}
    rows = session.execute(
        select(SlotSample.ts, SlotSample.model, SlotSample.version, SlotSample.slot, *SlotAggregate.columns(True))
        .where(SlotSample.ts > min(w.start for w in windows), SlotSample.ts <= now)
        .order_by(SlotSample.ts)
        .execution_options(yield_per=STREAM_ROWS)
    )
    for row in rows:
        for window in windows:
            window.add(row)
    return {w.rule.name: w.result() for w in windows}


def _as_slot_rule(rule: Rule) -> Rule | None:
    """The slot-metric rule whose rows give `rule`'s value (queue fill: the queue depth's), or None."""
    if isinstance(rule, BurnRule):
        return None
    if rule.condition.metric == "queue_fill":
        return replace(rule, condition=replace(rule.condition, metric="queue_depth_max"))
    return rule if rule.condition.metric in SLOT_METRICS else None


def _judged(rule: Rule, value: float | None, requests: int) -> float | Insufficient | None:
    """The value, unless the window saw fewer requests than the rule's `min_requests` to judge by."""
    if requests < rule.condition.min_requests:
        return rule.condition.too_little_traffic(requests)
    return value


_DEVICE_COLUMNS = (
    DeviceSample.device,
    DeviceSample.utilization,
    DeviceSample.memory_used_bytes,
    DeviceSample.memory_total_bytes,
    DeviceSample.fragmentation,
    DeviceSample.reserved_bytes,
)

_DEVICE_VALUE: dict[str, Callable[[Row[Any]], float | int | None]] = {
    "gpu_utilization": lambda row: row.utilization,
    "gpu_memory_used": lambda row: row.memory_used_bytes,
    "gpu_memory_total": lambda row: row.memory_total_bytes,
    "gpu_memory_fill": lambda row: (
        row.memory_used_bytes / row.memory_total_bytes
        if row.memory_used_bytes is not None and row.memory_total_bytes
        else None
    ),
    "fragmentation": lambda row: row.fragmentation,
    "heap_reserved": lambda row: row.reserved_bytes,
    "rss": lambda row: row.memory_used_bytes,
}


def _device_metric(session: Session, rule: Rule, now: datetime) -> dict[Key, float | Insufficient]:
    c = rule.condition
    reserved: dict[Key, list[float]] = defaultdict(list)
    wanted_cpu = c.metric in ("fragmentation", "heap_reserved", "rss")
    # NOTE: the columns, not ORM rows: building 180 DeviceSample objects (15 minutes of two workers' rows) cost
    # the fragmentation rule 2-3 ms of CPU every evaluation, on every server, busy or idle.
    query = select(*_DEVICE_COLUMNS).where(DeviceSample.ts > now - c.window, DeviceSample.ts <= now)
    query = query.where(DeviceSample.device == "cpu") if wanted_cpu else query.where(DeviceSample.device != "cpu")
    values: dict[Key, list[float]] = defaultdict(list)
    pick = _DEVICE_VALUE[c.metric]
    for row in session.execute(query.order_by(DeviceSample.ts)):
        value = pick(row)
        if value is not None:
            values[_key({"device": row.device}, c.by)].append(float(value))
            if row.reserved_bytes is not None:
                reserved[_key({"device": row.device}, c.by)].append(float(row.reserved_bytes))
    result: dict[Key, float | Insufficient] = {
        k: v for k, vs in values.items() if (v := _combine(vs, c.aggregation)) is not None
    }
    if c.min_reserved_mib:
        for key in result:
            mib = sum(reserved[key]) / len(reserved[key]) / 2**20 if reserved[key] else 0.0
            if mib < c.min_reserved_mib:
                result[key] = Insufficient(
                    f"too little memory held to judge: {mib:.0f} MiB reserved, fewer than the {c.min_reserved_mib} "
                    "MiB needed"
                )
    return result


def _filled(
    rule: Rule, observed: dict[Key, float | Insufficient], max_queue_size: int
) -> dict[Key, float | Insufficient]:
    """Queue fill is the deepest queue over the queue's size; any other rule's value is as observed."""
    if rule.condition.metric != "queue_fill":
        return observed
    return {k: v if isinstance(v, Insufficient) else v / max_queue_size for k, v in observed.items()}


def observe_all(
    session: Session,
    rules: list[Rule],
    now: datetime,
    *,
    engine_ready: Callable[[], bool],
    max_queue_size: int,
    closed_hours: ClosedHours | None = None,
) -> dict[str, dict[Key, float | Insufficient]]:
    """Every rule's `observe`, by rule name; the slot-metric rules share one reading of the history."""
    slot_rules = [slot_rule for rule in rules if (slot_rule := _as_slot_rule(rule)) is not None]
    shared = slot_observations(session, slot_rules, now)
    return {
        rule.name: _filled(rule, shared[rule.name], max_queue_size)
        if rule.name in shared
        else observe(
            session, rule, now, engine_ready=engine_ready, max_queue_size=max_queue_size, closed_hours=closed_hours
        )
        for rule in rules
    }


def observe(
    session: Session,
    rule: Rule,
    now: datetime,
    *,
    engine_ready: Callable[[], bool],
    max_queue_size: int,
    closed_hours: ClosedHours | None = None,
) -> dict[Key, float | Insufficient]:
    """Return the value of a rule's metric for every label set it groups by (`Insufficient`: too few requests).

    `closed_hours`: the sums of past hours kept between evaluations, for the burn rules' windows of days.
    """
    c = rule.condition
    if isinstance(rule, BurnRule):  # generated from an SLO: burn rates over two windows
        return burn_observation(session, rule, now, closed_hours)
    if (slot_rule := _as_slot_rule(rule)) is not None:
        return _filled(rule, slot_observations(session, [slot_rule], now)[rule.name], max_queue_size)
    if c.metric in DEVICE_METRICS or c.metric == "gpu_memory_fill":
        return _device_metric(session, rule, now)
    if c.metric == "drift_score":
        return drift_observation(session, c.window, c.by, c.min_samples, now)
    if c.metric == "engine_ready":
        return {(): 1.0 if engine_ready() else 0.0}
    if c.metric == "versions_live":
        result = {}
        for deployment in session.scalars(select(Deployment)):
            if active_rollout(session, deployment.model) is None:
                live = sum(1 for slot in Slot if deployment.version_in(slot) and deployment.weights()[slot] > 0)
                result[_key({"model": deployment.model}, c.by)] = float(live)
        return result
    if c.metric == "auto_rollbacks":
        rows = session.execute(
            select(AuditEvent.target, func.count())
            .where(AuditEvent.action == "rollout.auto_rollback", AuditEvent.ts > now - c.window)
            .group_by(AuditEvent.target)
        ).all()
        return {_key({"model": target}, c.by): float(count) for target, count in rows}
    if c.metric == "notification_failures":
        # Failed attempts, not messages: one message retried 8 times is 8 (a sent one's last attempt worked).
        failed = OutboxMessage.attempts - case((OutboxMessage.state == "sent", 1), else_=0)
        total = session.scalar(
            select(func.coalesce(func.sum(failed), 0)).where(
                OutboxMessage.last_error != "",
                or_(OutboxMessage.created_at > now - c.window, OutboxMessage.state == "pending"),
            )
        )
        return {(): float(total or 0)}
    raise KeyError(c.metric)
