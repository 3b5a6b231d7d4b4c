"""The notification outbox: deliver due messages, retry with backoff and Retry-After, lose nothing.

A message is committed with the alert change that caused it (evaluator.py); this job only moves
it from pending to sent or failed. A chat outage or a restart leaves it pending, due again later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.notifiers import make_notifier
from alerts.notifiers.base import Alert, DeliveryResult, Notification, Notifier
from alerts.notifiers.delivery import deliver
from alerts.states import Severity
from controlplane.models import OutboxMessage, Receiver
from controlplane.scheduler import utcnow

log = logging.getLogger(__name__)

Deliver = Callable[[Notifier, Notification, datetime], DeliveryResult]
MAX_ATTEMPTS = 24  # with the backoff below, about a day of trying before a message is given up


def backoff(attempts: int, base_s: float = 30.0) -> timedelta:
    """base, 2 x base, 4 x base, ... capped at one hour (30 s, 1 min, 2 min ... by default)."""
    return timedelta(seconds=min(base_s * 2 ** max(0, attempts - 1), 3600))


def _time(value: str | None, default: datetime) -> datetime:
    return datetime.fromisoformat(value) if value else default


def notification(payload: dict[str, Any], now: datetime) -> Notification:
    """Rebuild the notifier's view of a message from its stored payload."""
    alerts = [
        Alert(
            fingerprint=a["fingerprint"],
            name=a["name"],
            severity=Severity(a["severity"]),
            status=a["status"],
            starts_at=_time(a.get("starts_at"), now),
            labels=a.get("labels", {}),
            annotations=a.get("annotations", {}),
            value=a.get("value"),
            ends_at=_time(a.get("ends_at"), now) if a.get("ends_at") else None,
            runbook_url=a.get("runbook_url", ""),
            runbook_command=a.get("runbook_command", ""),
            console_url=a.get("console_url", ""),
        )  # fmt: skip
        for a in payload["alerts"]
    ]
    return Notification(
        receiver=payload["receiver"], group_key=payload["group_key"], status=payload["status"], alerts=alerts,
        common_labels=payload.get("common_labels", {}), external_url=payload.get("external_url", ""),
    )  # fmt: skip


def deliver_due(
    sessions: sessionmaker[Session],
    now: datetime | None = None,
    send: Deliver = deliver,
    limit: int = 50,
    backoff_s: float = 30.0,
) -> dict[str, int]:
    """Try every message that is due, oldest first; commit after each so a crash resends at most one."""
    now = now or utcnow()
    counts = {"sent": 0, "retrying": 0, "failed": 0}
    with sessions() as session:
        due = list(
            session.scalars(
                select(OutboxMessage)
                .where(OutboxMessage.state == "pending", OutboxMessage.next_attempt_at <= now)
                .order_by(OutboxMessage.id)
                .limit(limit)
            )
        )
        for message in due:
            outcome = _attempt(session, message, now, send, backoff_s)
            counts[outcome] += 1
            session.commit()
    return counts


def _attempt(session: Session, message: OutboxMessage, now: datetime, send: Deliver, backoff_s: float) -> str:
    receiver = session.get(Receiver, message.receiver)
    message.attempts += 1
    if receiver is None or not receiver.enabled:
        message.state, message.last_error = "failed", f"receiver {message.receiver!r} is missing or disabled"
        return "failed"
    try:
        notifier = make_notifier(receiver.kind, receiver.config)
        wait_until = _paced(session, notifier, message.receiver, now)
        if wait_until is not None:
            # NOTE: over the service's documented send rate: wait for the window, not counted as an attempt.
            message.attempts -= 1
            message.next_attempt_at = wait_until
            return "retrying"
        result = send(notifier, notification(message.payload, now), now)
    except ValueError as exc:  # a receiver whose configuration no longer validates
        message.state, message.last_error = "failed", str(exc)
        return "failed"
    if result.ok:
        message.state, message.sent_at, message.last_error = "sent", now, ""
        return "sent"
    message.last_error = result.error
    if result.permanent or message.attempts >= MAX_ATTEMPTS:
        message.state = "failed"
        log.error("notification %s to %s given up: %s", message.id, message.receiver, result.error)
        return "failed"
    wait = max(backoff(message.attempts, backoff_s), timedelta(seconds=result.retry_after_s or 0))
    message.next_attempt_at = now + wait
    log.warning("notification %s to %s failed (%s); retrying in %s", message.id, message.receiver, result.error, wait)
    return "retrying"


def _paced(session: Session, notifier: Notifier, receiver: str, now: datetime) -> datetime | None:
    """Return when the next message may go if this receiver is at one of its documented rate limits."""
    for limit, seconds in notifier.rate_limits:
        window_start = now - timedelta(seconds=seconds)
        recent = list(
            session.scalars(
                select(OutboxMessage.sent_at)
                .where(OutboxMessage.receiver == receiver, OutboxMessage.sent_at > window_start)
                .order_by(OutboxMessage.sent_at)
            )
        )
        if len(recent) >= limit:
            return recent[len(recent) - limit] + timedelta(seconds=seconds)
    return None
