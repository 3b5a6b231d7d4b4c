"""From alert states to outbox rows: each receiver's aggregation groups, one message per group flush.

The evaluator calls this inside its transaction. `alerts.dispatch` decides which groups flush;
this module loads and stores the groups (`notification_groups`), and queues each flush as one
outbox message in place of any older message of the same group still waiting (superseded, never
sent late). A message that would only say "resolved" goes out only to a receiver that may have
heard one of its alerts firing, so an overtaken FIRING never gets a RESOLVED of its own.
`withdraw_muted` takes back a message still waiting whose alerts are all silenced or inhibited
now (Alertmanager would not send them at its next flush): the evaluator and the outbox both call it,
and the group's log entry goes back to what the receiver was last really told.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.dispatch import GROUP_BY, GROUP_INTERVAL, GROUP_WAIT, Flush, Group, Route, dispatch
from alerts.lifecycle import Decision, Matcher, Tracked, inhibiting_models, mute_reason
from alerts.notifiers.alertmanager import common
from alerts.states import AlertState, Severity
from controlplane.alerting.silences import active_silences, as_silence
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
        if alert.state is not AlertState.FIRING:
            continue
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
        ident: Group(
            g.receiver,
            g.group_key,
            dict(g.labels),
            g.next_flush_at,
            g.last_notified_at,
            dict(g.notified),
            frozenset(g.resolved or ()),
            frozenset(g.held or ()),
            bool(g.flushed),
        )  # fmt: skip
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
        row.resolved, row.held, row.flushed = sorted(group.resolved), sorted(group.held), group.flushed
    told: dict[tuple[str, str], list[str]] = defaultdict(list)  # (fingerprint, status) -> receivers
    queued = 0
    for flush in flushes:
        alerts = [payload(alert, status) for alert, status in flush.alerts]
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

    NOTE: a message still pending for the same receiver and group is superseded, never sent late; the
    ends it carried that this one does not are carried on. A message with nothing firing goes out only
    if the receiver may have heard one of its alerts firing: the last message delivered to this group
    listed it firing, or a superseded one whose answer was lost (so it may have arrived) did.
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
    firing = any(a["status"] == "firing" for a in alerts)
    if not alerts or (not firing and not carried & heard_firing):
        return []
    status = "firing" if firing else "resolved"
    session.add(
        OutboxMessage(
            receiver=flush.receiver, group_key=flush.key, status=status, state="pending", attempts=0,
            next_attempt_at=now, created_at=flush.at,
            payload={"receiver": flush.receiver, "group_key": flush.key, "status": status, "alerts": alerts,
                     "group_labels": dict(flush.labels), "common_labels": common([a["labels"] for a in alerts]),
                     "common_annotations": common([a["annotations"] for a in alerts]),
                     "external_url": external_url, "key": uuid.uuid4().hex},
        )
    )  # fmt: skip
    return alerts


def withdraw_muted(session: Session, now: datetime) -> int:
    """Withdraw every message still waiting whose alerts are all silenced or inhibited now; return how many.

    Alertmanager mutes at each flush and never sends what is muted, so a FIRING queued before a
    silence (its receiver down) must not reach the receiver after it. The message is recorded as
    `withdrawn`, each alert's timeline says so, and its group's log entry goes back to the last
    message delivered (as Alertmanager's log holds only what was sent), so that what the silence
    hid is told as new once the silence ends.
    """
    pending = list(session.scalars(select(OutboxMessage).where(OutboxMessage.state == "pending")))
    if not pending:
        return 0
    silences = [as_silence(r) for r in active_silences(session, now)]
    sources = inhibiting_models(_tracked_firing_p0(session))
    withdrawn = 0
    for message in pending:
        alerts = message.payload.get("alerts") or []
        whys = [mute_reason(a.get("labels", {}), silences, sources, now) for a in alerts]
        if not alerts or any(why is None for why in whys):
            continue
        message.state, message.last_error = "withdrawn", f"withdrawn unsent: its alerts are {whys[0]}"
        NOTIFICATIONS.labels(message.receiver, "withdrawn").inc()
        for alert, why in zip(alerts, whys):
            session.add(AlertEvent(fingerprint=alert["fingerprint"], ts=now, kind="withdrawn", state=alert["status"],
                                   value=alert.get("value"), detail={"receiver": message.receiver, "why": why,
                                                                     "message": message.id}))  # fmt: skip
        _rewind(session, message)
        withdrawn += 1
    return withdrawn


def _tracked_firing_p0(session: Session) -> list[Tracked]:
    rows = session.scalars(
        select(AlertRecord).where(AlertRecord.state == AlertState.FIRING.value, AlertRecord.severity == "P0")
    )
    return [Tracked(r.fingerprint, r.rule, Severity(r.severity), dict(r.labels), AlertState(r.state)) for r in rows]


def _rewind(session: Session, message: OutboxMessage) -> None:
    """Set the message's group's log entry back to the last message of the group that was delivered."""
    group = session.get(NotificationGroup, (message.receiver, message.group_key))
    if group is None:
        return
    last = session.scalars(
        select(OutboxMessage)
        .where(
            OutboxMessage.receiver == message.receiver,
            OutboxMessage.group_key == message.group_key,
            OutboxMessage.state == "sent",
        )
        .order_by(OutboxMessage.id.desc())
    ).first()
    told = last.payload["alerts"] if last is not None else []
    group.notified = {a["fingerprint"]: a["severity"] for a in told if a["status"] == "firing"}
    group.resolved = sorted(a["fingerprint"] for a in told if a["status"] == "resolved")
    group.last_notified_at = last.created_at if last is not None else None
