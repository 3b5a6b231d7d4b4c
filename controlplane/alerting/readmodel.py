"""How alerts, their timelines, silences and receivers are shown: the JSON API and the console read these.

Pure readers over a session; nothing here writes. A receiver is described without its secrets or
its full URL (the notifier's own `describe`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.dispatch import REPEAT_INTERVAL
from alerts.notifiers import make_notifier
from alerts.rules import duration_text
from alerts.states import AlertState
from controlplane.alerting.notify import receiver_route
from controlplane.alerting.secretbox import Keyring, open_config
from controlplane.clock import utcnow
from controlplane.models import AlertEvent, AlertRecord, OutboxMessage, Receiver, SilenceRecord


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def alert_json(row: AlertRecord) -> dict[str, Any]:
    """Describe an alert: its rule, labels, state and when it changed, who acknowledged it."""
    return {
        "fingerprint": row.fingerprint, "rule": row.rule, "severity": row.severity, "state": row.state,
        "labels": row.labels, "value": row.value, "summary": row.summary, "pending_since": _iso(row.pending_since),
        "firing_since": _iso(row.firing_since), "resolved_at": _iso(row.resolved_at),
        "last_notified_at": _iso(row.last_notified_at), "acknowledged_by": row.acknowledged_by,
        "acknowledged_at": _iso(row.acknowledged_at), "runbook_attempts": row.runbook_attempts,
    }  # fmt: skip


def list_alerts(session: Session, state: AlertState | None = None) -> list[AlertRecord]:
    """Return alerts (of one state, if given), most urgent first: firing, then by severity and rule."""
    query = select(AlertRecord)
    if state is not None:
        query = query.where(AlertRecord.state == state.value)
    return sorted(session.scalars(query), key=lambda r: (r.state != AlertState.FIRING.value, r.severity, r.rule))


def alert_timeline(session: Session, fingerprint: str) -> list[dict[str, Any]]:
    """Return an alert's events, oldest first: state changes, notifications, suppressions, runbook runs, acks."""
    events = session.scalars(select(AlertEvent).where(AlertEvent.fingerprint == fingerprint).order_by(AlertEvent.id))
    return [
        {"ts": e.ts.isoformat(), "kind": e.kind, "state": e.state, "value": e.value, "detail": e.detail} for e in events
    ]


def silence_json(row: SilenceRecord) -> dict[str, Any]:
    """Describe a silence, with whether it mutes anything now."""
    return {
        "id": row.id, "matchers": row.matchers, "starts_at": row.starts_at.isoformat(), "ends_at": row.ends_at.isoformat(),
        "author": row.author, "comment": row.comment, "active": row.expired_by is None and row.ends_at > utcnow(),
        "expired_by": row.expired_by,
    }  # fmt: skip


def list_silences(session: Session) -> list[SilenceRecord]:
    """Return every silence, newest first (expired ones stay listed)."""
    return list(session.scalars(select(SilenceRecord).order_by(SilenceRecord.id.desc())))


def receiver_json(row: Receiver, keys: Keyring | None = None) -> dict[str, Any]:
    """Describe a receiver without its secrets or its full URL (`keys` open its stored, encrypted config)."""
    try:
        shown = make_notifier(row.kind, open_config(row.config, keys)).describe()
    except ValueError as exc:
        shown = {"kind": row.kind, "error": str(exc)}
    route = receiver_route(row, REPEAT_INTERVAL)
    repeat = None if row.repeat_interval_s is None else duration_text(route.repeat_interval)
    return {
        "name": row.name, "severities": row.severities, "matchers": row.matchers, "enabled": row.enabled,
        "group_by": list(route.group_by), "group_wait": duration_text(route.group_wait),
        "group_interval": duration_text(route.group_interval), "repeat_interval": repeat, **shown,
    }  # fmt: skip


def list_receivers(session: Session) -> list[Receiver]:
    """Return every receiver, by name."""
    return list(session.scalars(select(Receiver).order_by(Receiver.name)))


def notification_json(row: OutboxMessage) -> dict[str, Any]:
    """Describe one outbox message: where it goes, which group, how delivery stands; never its body."""
    return {
        "id": row.id, "receiver": row.receiver, "group_key": row.group_key, "status": row.status, "state": row.state,
        "attempts": row.attempts, "next_attempt_at": _iso(row.next_attempt_at) if row.state == "pending" else None,
        "last_error": row.last_error, "created_at": _iso(row.created_at), "sent_at": _iso(row.sent_at),
        "alerts": [a["fingerprint"] for a in row.payload.get("alerts", [])],
    }  # fmt: skip


def list_notifications(
    session: Session, state: str | None = None, receiver: str | None = None, limit: int = 100
) -> list[OutboxMessage]:
    """Return outbox messages, newest first (of one state or receiver, if given)."""
    query = select(OutboxMessage).order_by(OutboxMessage.id.desc()).limit(limit)
    if state is not None:
        query = query.where(OutboxMessage.state == state)
    if receiver is not None:
        query = query.where(OutboxMessage.receiver == receiver)
    return list(session.scalars(query))
