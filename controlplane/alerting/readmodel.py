"""How alerts, their timelines, silences and receivers are shown: the JSON API and the console read these.

Pure readers over a session; nothing here writes. A receiver is described without its secrets or
its full URL (the notifier's own `describe`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.notifiers import make_notifier
from alerts.states import AlertState
from controlplane.models import AlertEvent, AlertRecord, Receiver, SilenceRecord
from controlplane.scheduler import utcnow


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


def receiver_json(row: Receiver) -> dict[str, Any]:
    """Describe a receiver without its secrets or its full URL."""
    try:
        shown = make_notifier(row.kind, row.config).describe()
    except ValueError as exc:
        shown = {"kind": row.kind, "error": str(exc)}
    return {"name": row.name, "severities": row.severities, "matchers": row.matchers, "enabled": row.enabled, **shown}


def list_receivers(session: Session) -> list[Receiver]:
    """Return every receiver, by name."""
    return list(session.scalars(select(Receiver).order_by(Receiver.name)))
