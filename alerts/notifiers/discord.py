"""Discord webhook: one embed per alert, coloured by status and severity.

Per Discord's "Execute Webhook" and "Rate Limits" docs: a plain POST answers 204 No Content (200
with the message only when `?wait=true`). Over the limit it answers 429 with a JSON body
`{"message", "retry_after" (seconds, float), "global"}` and a Retry-After header; other errors
are JSON `{"code", "message"}` (e.g. 50035 Invalid Form Body, 10015 Unknown Webhook). Limits:
10 embeds, 256-character titles, 4,096-character descriptions, 1,024-character field values,
6,000 characters over all embeds, 2,000 for `content`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from alerts.notifiers import render
from alerts.notifiers.base import Alert, DeliveryResult, Notification, Notifier, Outgoing, snippet

MAX_EMBEDS = 10
TITLE_CHARS = 256
DESCRIPTION_CHARS = 4096
FIELD_CHARS = 1024
TOTAL_EMBED_CHARS = 6000
CONTENT_CHARS = 2000


def _embed_chars(embed: dict) -> int:
    fields = embed.get("fields", [])
    return (
        len(embed.get("title", ""))
        + len(embed.get("description", ""))
        + sum(len(f["name"]) + len(f["value"]) for f in fields)
    )


class DiscordNotifier(Notifier):
    """Post to a Discord webhook, e.g. ``{"url": "https://discord.com/api/webhooks/ID/TOKEN", "username": "Flightdeck"}``."""

    kind = "discord"
    # Discord documents no fixed webhook rate ("do not hard code"): it is read from each 429.
    options = frozenset({"username"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        username = config.get("username")
        if username is not None and (not isinstance(username, str) or not 1 <= len(username) <= 80):
            raise ValueError("discord: 'username' must be 1 to 80 characters")
        self.username = username

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        title = render.headline(notification)

        def payload(shown: int) -> dict:
            content = title if shown == len(alerts) else f"{title}\n{render.omitted(len(alerts) - shown)}"
            document: dict[str, Any] = {
                "content": render.clip(content, CONTENT_CHARS),
                "embeds": [self._embed(a) for a in alerts[:shown]],
                "allowed_mentions": {"parse": []},  # alert text must never ping @everyone
            }
            if self.username:
                document["username"] = self.username
            return document

        def fits(document: dict) -> bool:
            return sum(_embed_chars(e) for e in document["embeds"]) <= TOTAL_EMBED_CHARS

        body = json.dumps(render.fit(payload, len(alerts), fits, MAX_EMBEDS), ensure_ascii=False).encode()
        return Outgoing("POST", self.url, {"Content-Type": "application/json"}, body)

    @staticmethod
    def _embed(alert: Alert) -> dict:
        hex_colour = (
            render.RESOLVED_COLOUR if alert.status == "resolved" else render.FIRING_COLOURS[alert.severity.value]
        )
        fields = [
            {"name": "Value", "value": render.clip(alert.shown_value, render.VALUE_CHARS), "inline": True},
            {"name": "Since", "value": render.when(alert.starts_at), "inline": True},
        ]
        if alert.status == "resolved" and alert.ends_at:
            fields.append({"name": "Resolved", "value": render.when(alert.ends_at), "inline": True})
        lines = [" · ".join(f"[{label}]({url})" for url, label in render.links(alert))]
        if alert.runbook_command:
            command = render.clip(alert.runbook_command, render.COMMAND_CHARS).replace("```", "'''")
            lines.append(f"**Run:**\n```\n{command}\n```")
        embed: dict[str, Any] = {
            "title": render.clip(f"{render.state_word(alert)} · {alert.severity} · {alert.summary}", TITLE_CHARS),
            "color": int(hex_colour.lstrip("#"), 16),
            "fields": fields,
            "timestamp": render.utc(alert.starts_at).isoformat(),
        }
        description = "\n".join(line for line in lines if line)
        if description:  # Discord refuses an empty description
            embed["description"] = render.clip(description, DESCRIPTION_CHARS)
        if alert.console_url:
            embed["url"] = alert.console_url
        return embed

    def interpret(self, status: int, headers: Mapping[str, str], body: bytes) -> DeliveryResult:
        """2xx (204) delivered; on 429 wait the JSON `retry_after` seconds, else the Retry-After header."""
        verdict = super().interpret(status, headers, body)
        if verdict.ok:
            return verdict
        try:
            document = json.loads(body.decode("utf-8"))
        except ValueError:
            document = None
        if not isinstance(document, dict):
            return verdict
        error = self.redact(
            f"HTTP {status}: discord code {document.get('code', '-')}: {document.get('message', snippet(body))}"
        )
        retry_after = verdict.retry_after_s
        if status == 429 and isinstance(document.get("retry_after"), int | float):
            retry_after = max(0.0, float(document["retry_after"]))
        return DeliveryResult(ok=False, retry_after_s=retry_after, permanent=verdict.permanent, error=error)
