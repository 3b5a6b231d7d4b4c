"""The notification outbox: deliver due messages in order, retry with backoff and Retry-After, lose nothing.

A message is committed with the alert change that caused it (evaluator.py); this job only moves
it from pending to sent or failed (the evaluator marks one superseded when a newer message for
the same group replaces it), or withdrawn when every alert it carries is muted by the time it is
due (`notify.withdraw_muted`: Alertmanager never sends what a silence or inhibition covers at the flush). A chat outage or a restart leaves it pending, due again later.
Order: a receiver's messages for one group go out oldest first, a later one waiting while an
earlier one retries; when a service says when to come back (Retry-After, a rate-limit code),
the whole receiver waits, every group, and then resumes oldest first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session, sessionmaker

from alerts.notifiers import make_notifier
from alerts.notifiers.base import Alert, DeliveryResult, Notification, Notifier
from alerts.notifiers.delivery import deliver
from alerts.states import Severity
from controlplane import quickread, tracing
from controlplane.alerting.notify import withdraw_muted
from controlplane.alerting.secretbox import Keyring, open_config
from controlplane.clock import utcnow
from controlplane.metrics import NOTIFICATION_ATTEMPTS, NOTIFICATIONS
from controlplane.models import OutboxMessage, Receiver

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
            value_text=a.get("value_text", ""),
            ends_at=_time(a.get("ends_at"), now) if a.get("ends_at") else None,
            runbook_url=a.get("runbook_url", ""),
            docs_url=a.get("docs_url", ""),
            runbook_command=a.get("runbook_command", ""),
            console_url=a.get("console_url", ""),
        )  # fmt: skip
        for a in payload["alerts"]
    ]
    return Notification(
        receiver=payload["receiver"], group_key=payload["group_key"], status=payload["status"], alerts=alerts,
        group_labels=payload.get("group_labels", {}), common_labels=payload.get("common_labels", {}),
        common_annotations=payload.get("common_annotations", {}), external_url=payload.get("external_url", ""),
        key=payload.get("key", ""),
    )  # fmt: skip


_ANY_PENDING = select(exists().where(OutboxMessage.state == "pending"))


def deliver_due(
    sessions: sessionmaker[Session],
    now: datetime | None = None,
    send: Deliver = deliver,
    limit: int = 50,
    backoff_s: float = 30.0,
    keys: Keyring | None = None,
) -> dict[str, int]:
    """Try every message that is due, oldest first; commit after each so a crash resends at most one.

    `keys` open the receivers' encrypted configurations (a plaintext one, from before encryption, is read as is).
    """
    now = now or utcnow()
    counts = {"sent": 0, "retrying": 0, "failed": 0}
    if not quickread.holds(sessions, _ANY_PENDING):
        return counts  # NOTE: the usual case, every few seconds: one read
    with sessions() as session:
        # NOTE: a message whose alerts a silence or a firing P0 mutes now is withdrawn, not sent late.
        if withdraw_muted(session, now):
            session.commit()
        waiting = set(session.scalars(select(Receiver.name).where(Receiver.backoff_until > now)))
        pending = list(
            session.scalars(select(OutboxMessage).where(OutboxMessage.state == "pending").order_by(OutboxMessage.id))
        )
        blocked: set[tuple[str, str]] = set()  # groups whose oldest pending message is still waiting
        tried = 0
        for message in pending:
            group = (message.receiver, message.group_key)
            # NOTE: a group's messages go oldest first, and none while its receiver waits.
            if group in blocked or message.receiver in waiting or message.next_attempt_at > now:
                blocked.add(group)
                continue
            if tried >= limit:
                break
            if not _claim(session, message, now):  # another deliverer holds it or finished it: keep order
                blocked.add(group)
                continue
            tried += 1
            with tracing.span("alert.notification", receiver=message.receiver, message=message.id) as span:
                outcome = _attempt(session, message, now, send, backoff_s, keys)
                span.set_attribute("flightdeck.outcome", outcome)
            counts[outcome] += 1
            if outcome == "retrying":
                blocked.add(group)
            receiver = session.get(Receiver, message.receiver)
            if receiver is not None and receiver.backoff_until is not None and receiver.backoff_until > now:
                waiting.add(message.receiver)
            session.commit()
    return counts


def _claim(session: Session, message: OutboxMessage, now: datetime) -> bool:
    """Lock one message for this attempt; return False when another deliverer holds it or has moved it on.

    NOTE: on PostgreSQL the row stays locked (FOR UPDATE SKIP LOCKED) until the commit that records
    the attempt, so two leaders overlapping across a hand-over never both send it, and a deliverer
    killed mid-send releases the lock with its connection, leaving the message pending for the next.
    SQLite ignores the lock; there the re-read state, and the lease, keep one process delivering.
    """
    claimed = session.scalars(
        select(OutboxMessage)
        .where(OutboxMessage.id == message.id, OutboxMessage.state == "pending")
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    ).one_or_none()
    return claimed is not None and claimed.next_attempt_at <= now


def _attempt(
    session: Session, message: OutboxMessage, now: datetime, send: Deliver, backoff_s: float, keys: Keyring | None
) -> str:
    receiver = session.get(Receiver, message.receiver)
    message.attempts += 1
    if receiver is None or not receiver.enabled:
        message.state, message.last_error = "failed", f"receiver {message.receiver!r} is missing or disabled"
        NOTIFICATIONS.labels(message.receiver, "failed").inc()
        return "failed"
    try:
        notifier = make_notifier(receiver.kind, open_config(receiver.config, keys))
        wait_until = _paced(session, notifier, message.receiver, now)
        if wait_until is not None:
            # NOTE: over the service's documented send rate: wait for the window, not counted as an attempt.
            message.attempts -= 1
            message.next_attempt_at = wait_until
            return "retrying"
        result = send(notifier, notification(message.payload, now), now)
    except ValueError as exc:  # a receiver whose configuration no longer validates
        message.state, message.last_error = "failed", str(exc)
        NOTIFICATIONS.labels(message.receiver, "failed").inc()
        return "failed"
    outcome = (
        "delivered" if result.ok else "failed" if result.permanent or message.attempts >= MAX_ATTEMPTS else "retry"
    )
    NOTIFICATION_ATTEMPTS.labels(message.receiver, receiver.kind, outcome).inc()
    if result.ok:
        message.state, message.sent_at, message.last_error = "sent", now, ""
        NOTIFICATIONS.labels(message.receiver, "sent").inc()
        return "sent"
    message.last_error = result.error
    message.maybe_delivered = message.maybe_delivered or result.maybe_delivered
    if outcome == "failed":
        message.state = "failed"
        NOTIFICATIONS.labels(message.receiver, "failed").inc()
        log.error("notification %s to %s given up: %s", message.id, message.receiver, result.error)
        return "failed"
    wait = max(backoff(message.attempts, backoff_s), timedelta(seconds=result.retry_after_s or 0))
    message.next_attempt_at = now + wait
    if result.retry_after_s is not None:  # the service said when to come back: everything to it waits
        receiver.backoff_until = now + wait
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
