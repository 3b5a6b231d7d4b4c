"""Alerts and notifications to notify about, built the same way in every notifier test."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from alerts.notifiers import Alert, Notification

NOW = datetime(2024, 5, 1, 12, 1, 0, tzinfo=UTC)
STARTED = datetime(2024, 5, 1, 12, 0, 5, 120000, tzinfo=UTC)
ENDED = datetime(2024, 5, 1, 12, 30, 0, tzinfo=UTC)


def make_alert(**changes: object) -> Alert:
    """A firing P0 latency alert on the text model; `changes` override any field."""
    alert = Alert(
        fingerprint="3f2a9c1b7d6e5a40",
        name="HighLatency",
        severity="P0",
        status="firing",
        starts_at=STARTED,
        labels={"alertname": "HighLatency", "model": "textcls", "severity": "P0"},
        annotations={"summary": "textcls p99 latency above 250 ms", "description": "p99 over 5 minutes"},
        value=0.412,
        value_text="p99 412 ms > 250 ms",
        runbook_url="https://runbooks.example/latency",
        runbook_command="python runbooks/rollback.py --model textcls",
        console_url="https://flightdeck.example/alerts/3f2a9c1b7d6e5a40",
    )
    return replace(alert, **changes)


def resolved_alert(**changes: object) -> Alert:
    return make_alert(status="resolved", ends_at=ENDED, **changes)


def make_notification(*alerts: Alert, **changes: object) -> Notification:
    """One group for the `ops` receiver; firing when any alert fires."""
    alerts = alerts or (make_alert(),)
    status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    notification = Notification(
        receiver="ops",
        group_key='{}:{alertname="HighLatency"}',
        status=status,
        alerts=list(alerts),
        group_labels={"alertname": "HighLatency"},
        common_labels={"alertname": "HighLatency"},
        common_annotations={},
        external_url="https://flightdeck.example",
    )
    return replace(notification, **changes)


def many_alerts(count: int, summary: str = "model {i} is slow") -> list[Alert]:
    """`count` firing alerts on different models, with distinct summaries."""
    return [
        make_alert(
            fingerprint=f"{i:016x}",
            labels={"alertname": "HighLatency", "model": f"m{i}", "severity": "P1"},
            annotations={"summary": summary.format(i=i)},
            severity="P1",
        )
        for i in range(count)
    ]
