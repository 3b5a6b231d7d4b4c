"""Alerts, their timeline, silences, chat receivers and the notification outbox."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Index, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models import Base


class AlertRecord(Base):
    """The current state of one alert (a rule and a label set)."""

    __tablename__ = "alerts"

    fingerprint: Mapped[str] = mapped_column(String(32), primary_key=True)
    rule: Mapped[str] = mapped_column(String(64), index=True)
    severity: Mapped[str] = mapped_column(String(4))
    labels: Mapped[dict] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    value: Mapped[float | None]
    summary: Mapped[str] = mapped_column(Text, default="")
    pending_since: Mapped[datetime | None]
    firing_since: Mapped[datetime | None]
    resolved_at: Mapped[datetime | None]
    last_notified_at: Mapped[datetime | None]
    acknowledged_by: Mapped[str | None] = mapped_column(String(128))
    acknowledged_at: Mapped[datetime | None]
    runbook_attempts: Mapped[int] = mapped_column(default=0)
    last_runbook_at: Mapped[datetime | None]
    updated_at: Mapped[datetime]  # when the evaluator last changed the row


class AlertEvent(Base):
    """One entry of an alert's timeline: a state change, a notification, a runbook run, an ack."""

    __tablename__ = "alert_events"
    __table_args__ = (Index("ix_alert_events_fingerprint_ts", "fingerprint", "ts"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(32))
    ts: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))  # state | notified | suppressed | acknowledged | runbook
    state: Mapped[str | None] = mapped_column(String(16))
    value: Mapped[float | None]
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


class SilenceRecord(Base):
    """Mute notifications for alerts matching every matcher, between two times."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(primary_key=True)
    matchers: Mapped[list] = mapped_column(JSON)  # [{"label", "value", "regex"}]
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    author: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    expired_by: Mapped[str | None] = mapped_column(String(128))


class Receiver(Base):
    """A chat destination, which alerts it gets (severities and label matchers) and its route.

    The route is Alertmanager's: `group_by` label names, `group_wait`, `group_interval` and
    `repeat_interval` in seconds; None takes the default (alertname, 30 s, 5 min, the settings'
    repeat interval). `backoff_until` holds every message to it while the service asked us to wait.
    """

    __tablename__ = "receivers"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # slack | feishu | dingtalk | wecom | teams | discord | alertmanager
    config: Mapped[dict] = mapped_column(JSON)  # url and secrets: never returned by the API
    severities: Mapped[list] = mapped_column(JSON)  # e.g. ["P0", "P1"]
    matchers: Mapped[list] = mapped_column(JSON, default=list)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime]
    group_by: Mapped[list | None] = mapped_column(JSON)
    group_wait_s: Mapped[float | None]
    group_interval_s: Mapped[float | None]
    repeat_interval_s: Mapped[float | None]
    backoff_until: Mapped[datetime | None]


class NotificationGroup(Base):
    """An aggregation group of one receiver: its next tick, the alerts it holds, what its last message told."""

    __tablename__ = "notification_groups"

    receiver: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    labels: Mapped[dict] = mapped_column(JSON)
    next_flush_at: Mapped[datetime]
    last_notified_at: Mapped[datetime | None]
    notified: Mapped[dict] = mapped_column(JSON)  # fingerprint -> severity, of alerts told firing
    resolved: Mapped[list] = mapped_column(JSON, default=list, server_default="[]")  # told resolved
    held: Mapped[list] = mapped_column(JSON, default=list, server_default="[]")  # fingerprints in the group
    flushed: Mapped[bool] = mapped_column(default=False, server_default=false())


class OutboxMessage(Base):
    """A notification waiting to be delivered, or its delivery record: nothing is lost to an outage."""

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_state_due", "state", "next_attempt_at"),
        Index("ix_outbox_receiver_group", "receiver", "group_key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    receiver: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))  # firing | resolved
    payload: Mapped[dict] = mapped_column(JSON)  # the Notification, serialised, with its idempotency key
    state: Mapped[str] = mapped_column(String(16))  # pending | sent | failed | superseded | withdrawn
    attempts: Mapped[int] = mapped_column(default=0)
    # An attempt whose answer was lost (a timeout, a dropped connection) may have been delivered.
    maybe_delivered: Mapped[bool] = mapped_column(default=False)
    next_attempt_at: Mapped[datetime]
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
