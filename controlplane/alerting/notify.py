"""From alert states to outbox rows: each receiver's aggregation groups, one message per group flush.

The evaluator calls this inside its transaction. `alerts.dispatch` decides which groups flush;
this module loads and stores the groups (`notification_groups`), and queues each flush as one
outbox message in place of any older message of the same group still waiting (superseded, never
sent late). A resolved alert is only told to a receiver that may have heard it firing, so a
silenced, inhibited or overtaken FIRING never gets a RESOLVED of its own.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.dispatch import GROUP_BY, GROUP_INTERVAL, GROUP_WAIT, Flush, Group, Route, dispatch
from alerts.lifecycle import Decision, Matcher, Tracked
from alerts.notifiers.alertmanager import common
from alerts.states import Severity
from controlplane.metrics import NOTIFICATIONS
from controlplane.models import AlertEvent, AlertRecord, NotificationGroup, OutboxMessage, Receiver

# Describes one alert for a message with its status ("firing" or "resolved"): `evaluator.alert_payload`.
Payload = Callable[[Tracked, str], dict]


def _seconds(value: float | None, default: timedelta) -> timedelta:
    return default if value is None else timedelta(seconds=value)


def receiver_route(receiver: Receiver, repeat_interval: timedelta) -> Route:
    """Return a receiver's route; unset values take Alertmanager's defaults (repeat: `repeat_interval`)."""
    return Route(
        receiver=receiver.name,
        severities=tuple(s.value for s in Severity if s.value in receiver.severities),
        matchers=tuple(Matcher(m["label"], m["value"], bool(m.get("regex"))) for m in receiver.matchers or []),
        group_by=GROUP_BY if receiver.group_by is None else tuple(receiver.group_by),
        group_wait=_seconds(receiver.group_wait_s, GROUP_WAIT),
        group_interval=_seconds(receiver.group_interval_s, GROUP_INTERVAL),
        repeat_interval=_seconds(receiver.repeat_interval_s, repeat_interval),
    )


def record_suppressed(session: Session, outcome: Decision, now: datetime) -> int:
    """Put one "suppressed" entry on the timeline per firing episode, not one per evaluation."""
    recorded = 0
    for fp, why in outcome.muted.items():
        alert = outcome.tracked[fp]
        since = alert.firing_since or now
        seen = session.scalar(
            select(AlertEvent.id)
            .where(AlertEvent.fingerprint == fp, AlertEvent.kind == "suppressed", AlertEvent.ts >= since)
            .limit(1)
        )
        if seen is None:
            session.add(AlertEvent(fingerprint=fp, ts=now, kind="suppressed", state=alert.state.value,
                                   value=alert.value, detail={"why": why}))  # fmt: skip
            recorded += 1
    return recorded


def queue_notifications(
    session: Session,
    outcome: Decision,
    rows: dict[str, AlertRecord],
    payload: Payload,
    repeat_interval: timedelta,
    external_url: str,
    now: datetime,
) -> int:
    """Advance every enabled receiver's groups, queue the messages they flush; return how many were queued."""
    receivers = session.scalars(select(Receiver).where(Receiver.enabled.is_(True)))
    routes = [receiver_route(r, repeat_interval) for r in receivers]
    stored = {(g.receiver, g.group_key): g for g in session.scalars(select(NotificationGroup))}
    groups = {
        ident: Group(g.receiver, g.group_key, dict(g.labels), g.next_flush_at, g.last_notified_at, dict(g.notified))
        for ident, g in stored.items()
    }
    updated, flushes = dispatch(routes, outcome.tracked.values(), outcome.muted, groups, now)
    for ident, group in updated.items():
        row = stored.get(ident)
        if group is None:
            if row is not None:
                session.delete(row)
            continue
        if row is None:
            row = NotificationGroup(receiver=group.receiver, group_key=group.key)
            session.add(row)
        row.labels, row.next_flush_at = dict(group.labels), group.next_flush_at
        row.last_notified_at, row.notified = group.last_notified_at, dict(group.notified)
    told: dict[tuple[str, str], list[str]] = defaultdict(list)  # (fingerprint, status) -> receivers
    queued = 0
    for flush in flushes:
        alerts = [payload(a, "firing") for a in flush.firing] + [payload(a, "resolved") for a in flush.resolved]
        carried = _enqueue(session, flush, alerts, external_url, now)
        queued += bool(carried)
        for alert in carried:
            told[(alert["fingerprint"], alert["status"])].append(flush.receiver)
    for (fp, status), names in told.items():
        row = rows[fp]
        if status == "firing":
            row.last_notified_at = now
        session.add(AlertEvent(fingerprint=fp, ts=now, kind="notified", state=row.state, value=row.value,
                               detail={"status": status, "receivers": names}))  # fmt: skip
    return queued


def _enqueue(session: Session, flush: Flush, alerts: list[dict], external_url: str, now: datetime) -> list[dict]:
    """Queue one group's message in place of any older one still waiting; return the alerts it carries.

    NOTE: a message still pending for the same receiver and group is superseded, never sent late.
    A resolved alert goes out only if the receiver may have heard it firing: the last message
    delivered to this group listed it firing, or a superseded one whose answer was lost (so it
    may have arrived) did.
    """
    same_group = (OutboxMessage.receiver == flush.receiver, OutboxMessage.group_key == flush.key)
    pending = list(session.scalars(select(OutboxMessage).where(*same_group, OutboxMessage.state == "pending")))
    last_sent = session.scalars(
        select(OutboxMessage).where(*same_group, OutboxMessage.state == "sent").order_by(OutboxMessage.id.desc())
    ).first()
    heard = [m for m in pending if m.maybe_delivered] + ([last_sent] if last_sent is not None else [])
    heard_firing = {a["fingerprint"] for m in heard for a in m.payload["alerts"] if a["status"] == "firing"}
    carried = {a["fingerprint"] for a in alerts}
    for message in pending:
        message.state = "superseded"
        NOTIFICATIONS.labels(message.receiver, "superseded").inc()
        for alert in message.payload["alerts"]:  # an end not yet told still needs telling
            if alert["status"] == "resolved" and alert["fingerprint"] not in carried:
                alerts.append(alert)
                carried.add(alert["fingerprint"])
    alerts = [a for a in alerts if a["status"] == "firing" or a["fingerprint"] in heard_firing]
    if not alerts:
        return []
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    session.add(
        OutboxMessage(
            receiver=flush.receiver, group_key=flush.key, status=status, state="pending", attempts=0,
            next_attempt_at=now, created_at=now,
            payload={"receiver": flush.receiver, "group_key": flush.key, "status": status, "alerts": alerts,
                     "group_labels": dict(flush.labels), "common_labels": common([a["labels"] for a in alerts]),
                     "common_annotations": common([a["annotations"] for a in alerts]),
                     "external_url": external_url, "key": uuid.uuid4().hex},
        )
    )  # fmt: skip
    return alerts
