"""Generic JSON webhook, byte for byte Alertmanager's `webhook_config` body (version "4").

What Alertmanager sends (notify/webhook/webhook.go, template/template.go): the fields of
`template.Data` (receiver, status, alerts, groupLabels, commonLabels, commonAnnotations,
externalURL) then version, groupKey, truncatedAlerts, encoded by Go (see `goformat`) with a
trailing newline. `receiver` goes through regexp.QuoteMeta; `status` is firing when any alert
fires; a firing alert's `endsAt` is the zero time `0001-01-01T00:00:00Z` (Alertmanager hides an
end not yet reached); `commonLabels`/`commonAnnotations` are what all kept alerts share;
`truncatedAlerts` counts alerts dropped by `max_alerts`. Anything that takes Alertmanager's
webhook can take ours. Our alert's severity, summary, value, runbook link and command travel as
the labels `alertname`/`severity` and the annotations `summary`, `value`, `runbook_url`,
`runbook_command` (never overriding ones the alert already has); `generatorURL` is the console.

Beyond Alertmanager: an `Idempotency-Key` header (the IETF httpapi draft's name) carries the
message's key, the same on every attempt of one message (a retry, or a new leader's re-send after
the old one died mid-send) and new for every message, so a receiver can tell a re-send from a real
repeat; `groupKey` in the body names the alert group, as Alertmanager's does. The body stays
byte for byte Alertmanager's.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from alerts.notifiers.base import Alert, Notification, Notifier, Outgoing
from alerts.notifiers.goformat import Fields, go_json, go_time, label_fingerprint, quote_meta

VERSION = "4"


def common(maps: list[dict[str, str]]) -> dict[str, str]:
    """What every map holds with the same value (Alertmanager's commonLabels and commonAnnotations)."""
    if not maps:
        return {}
    return {k: v for k, v in maps[0].items() if all(m.get(k) == v for m in maps[1:])}


class AlertmanagerWebhookNotifier(Notifier):
    """POST Alertmanager's webhook body; optional auth, e.g.
    ``{"url": "https://hooks.example/am", "bearer_token": "T", "max_alerts": 50}`` or
    ``{"url": ..., "basic_auth": {"username": "u", "password": "p"}}``.
    """

    kind = "webhook"
    options = frozenset({"bearer_token", "basic_auth", "max_alerts"})
    secret_options = frozenset({"bearer_token"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        token, basic = config.get("bearer_token"), config.get("basic_auth")
        if token is not None and basic is not None:
            raise ValueError("webhook: give bearer_token or basic_auth, not both")
        self._authorization = ""
        if token is not None:
            if not isinstance(token, str) or not token:
                raise ValueError("webhook: 'bearer_token' must be a non-empty string")
            self._authorization = f"Bearer {token}"
        if basic is not None:
            if not isinstance(basic, Mapping) or not all(
                isinstance(basic.get(k), str) for k in ("username", "password")
            ):
                raise ValueError("webhook: 'basic_auth' needs string 'username' and 'password'")
            credentials = base64.b64encode(f"{basic['username']}:{basic['password']}".encode()).decode()
            self._authorization = f"Basic {credentials}"
            self._secrets += [p for p in (basic["password"], credentials) if p]
        max_alerts = config.get("max_alerts", 0)
        if isinstance(max_alerts, bool) or not isinstance(max_alerts, int) or max_alerts < 0:
            raise ValueError("webhook: 'max_alerts' must be a whole number >= 0 (0: no limit)")
        self.max_alerts = max_alerts

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = list(notification.alerts)
        truncated = 0
        if self.max_alerts and len(alerts) > self.max_alerts:
            alerts, truncated = alerts[: self.max_alerts], len(alerts) - self.max_alerts
        labels = [self._labels(a) for a in alerts]
        annotations = [self._annotations(a) for a in alerts]
        message = Fields(
            (
                ("receiver", quote_meta(notification.receiver)),
                ("status", "firing" if any(a.status == "firing" for a in alerts) else "resolved"),
                ("alerts", [self._alert(a, lbl, ann) for a, lbl, ann in zip(alerts, labels, annotations)]),
                ("groupLabels", dict(notification.group_labels)),
                ("commonLabels", common(labels)),
                ("commonAnnotations", common(annotations)),
                ("externalURL", notification.external_url),
                ("version", VERSION),
                ("groupKey", notification.group_key),
                ("truncatedAlerts", truncated),
            )
        )
        headers = {"Content-Type": "application/json", "User-Agent": "Flightdeck"}
        if self._authorization:
            headers["Authorization"] = self._authorization
        if notification.key:
            headers["Idempotency-Key"] = notification.key
        return Outgoing("POST", self.url, headers, (go_json(message) + "\n").encode())

    @staticmethod
    def _labels(alert: Alert) -> dict[str, str]:
        labels = dict(alert.labels)
        labels.setdefault("alertname", alert.name)
        labels.setdefault("severity", alert.severity.value)
        return labels

    @staticmethod
    def _annotations(alert: Alert) -> dict[str, str]:
        annotations = dict(alert.annotations)
        extra = {
            "summary": alert.summary,
            "value": alert.shown_value if alert.value is not None or alert.value_text else "",
            "runbook_url": alert.runbook_url,
            "runbook_command": alert.runbook_command,
        }
        for key, text in extra.items():
            if text:
                annotations.setdefault(key, text)
        return annotations

    @staticmethod
    def _alert(alert: Alert, labels: dict[str, str], annotations: dict[str, str]) -> Fields:
        return Fields(
            (
                ("status", alert.status),
                ("labels", labels),
                ("annotations", annotations),
                ("startsAt", go_time(alert.starts_at)),
                ("endsAt", go_time(alert.ends_at if alert.status == "resolved" else None)),
                ("generatorURL", alert.console_url),
                ("fingerprint", alert.fingerprint or label_fingerprint(labels)),
            )
        )

    def describe(self) -> dict[str, Any]:
        auth = self._authorization.split(" ", 1)[0].lower() if self._authorization else "none"
        return {**super().describe(), "auth": auth, "max_alerts": self.max_alerts}
