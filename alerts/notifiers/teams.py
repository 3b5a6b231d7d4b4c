"""Microsoft Teams through a Workflows webhook ("When a Teams webhook request is received").

Workflows accept Adaptive Cards only (not the connectors' MessageCard), wrapped as
`{"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive",
"contentUrl": null, "content": <AdaptiveCard>}]}`. The trigger answers 202 Accepted with an empty
body once the flow run is queued: a flow that fails later is not visible here. Teams caps a
message at 28 KB and throttles more than four requests a second (429 with Retry-After). The
URL's `sig` query parameter is the credential.
"""

from __future__ import annotations

import json
from datetime import datetime

from alerts.notifiers import render
from alerts.notifiers.base import Alert, Notification, Notifier, Outgoing

MAX_ALERTS = 20
MAX_BODY_BYTES = 28 * 1024
CARD_VERSION = "1.4"
COLOURS = {"P0": "Attention", "P1": "Warning", "P2": "Warning"}


def _colour(alert: Alert) -> str:
    return "Good" if alert.status == "resolved" else COLOURS[alert.severity.value]


class TeamsNotifier(Notifier):
    """Post an Adaptive Card to a Teams Workflows webhook, e.g. ``{"url": "https://prod-00.westus.logic.azure.com/workflows/...&sig=S"}``."""

    kind = "teams"
    rate_limits = ((4, 1.0),)

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        first = alerts[0]
        heading_colour = "Good" if notification.status == "resolved" else COLOURS[render.top_severity(notification)]
        actions = [
            {"type": "Action.OpenUrl", "title": title, "url": url}
            for url, title in (
                (first.console_url, "Open console"),
                (first.runbook_url, "Open runbook"),
                (first.docs_url, "What it means"),
            )
            if url
        ]

        def body(shown: int) -> bytes:
            items: list[dict] = [
                {
                    "type": "TextBlock",
                    "text": render.headline(notification),
                    "weight": "Bolder",
                    "size": "Medium",
                    "wrap": True,
                    "color": heading_colour,
                }
            ]
            items += [self._container(a) for a in alerts[:shown]]
            if shown < len(alerts):
                items.append(
                    {"type": "TextBlock", "text": render.omitted(len(alerts) - shown), "isSubtle": True, "wrap": True}
                )
            card = {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": CARD_VERSION,
                "msteams": {"width": "Full"},
                "body": items,
                "actions": actions,
            }
            attachment = {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
            return json.dumps({"type": "message", "attachments": [attachment]}, ensure_ascii=False).encode()

        payload = render.fit(body, len(alerts), lambda b: len(b) <= MAX_BODY_BYTES, MAX_ALERTS)
        return Outgoing("POST", self.url, {"Content-Type": "application/json; charset=utf-8"}, payload)

    @staticmethod
    def _container(alert: Alert) -> dict:
        facts = [
            {"title": "Severity", "value": alert.severity.value},
            {"title": "Value", "value": render.clip(alert.shown_value, render.VALUE_CHARS)},
            {"title": "Since", "value": render.when(alert.starts_at)},
        ]
        if alert.status == "resolved" and alert.ends_at:
            facts.append({"title": "Resolved", "value": render.when(alert.ends_at)})
        items: list[dict] = [
            {
                "type": "TextBlock",
                "text": f"**{render.state_word(alert)}** {render.clip(alert.summary, render.SUMMARY_CHARS)}",
                "wrap": True,
                "color": _colour(alert),
            },
            {"type": "FactSet", "facts": facts},
        ]
        links = [f"[{label}]({url})" for url, label in render.links(alert)]
        if links:
            items.append({"type": "TextBlock", "text": " · ".join(links), "wrap": True})
        if alert.runbook_command:
            command = render.clip(alert.runbook_command, render.COMMAND_CHARS)
            items.append({"type": "TextBlock", "text": command, "fontType": "Monospace", "wrap": True})
        return {"type": "Container", "separator": True, "items": items}
