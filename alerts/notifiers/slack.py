"""Slack incoming webhook: Block Kit message, colour bar per status (docs.slack.dev, incoming webhooks).

Slack answers 200 `ok`; errors are plain strings with a status: 400 `invalid_payload`, 403
`action_prohibited`, 404 `channel_not_found`, 410 `channel_is_archived`, 500 `rollup_error`; 429
with Retry-After when over about one message per second. Limits: 50 blocks, 3,000 characters per
section, 150 per header.
"""

from __future__ import annotations

import json
from datetime import datetime

from alerts.notifiers import render
from alerts.notifiers.base import Alert, Notification, Notifier, Outgoing

MAX_ALERTS = 20
SECTION_CHARS = 3000
HEADER_CHARS = 150


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(url: str, label: str) -> str:
    safe = _escape(url).replace("|", "%7C").replace(" ", "%20")
    return f"<{safe}|{label}>"


# Slack mrkdwn: &, < and > escaped everywhere, links as <url|label>, the end and start on one line.
LINES = render.AlertLines(
    title="*{state}* · *{severity}* · {summary}",
    value="*Value:* `{value}`",
    since="*Since:* {since}",
    resolved="*Resolved:* {resolved} (since {since})",
    run="*Run:*\n```{command}```",
    escape=_escape,
    escape_command=_escape,
    link=_link,
    resolved_replaces_since=True,
)


class SlackNotifier(Notifier):
    """Post to a Slack incoming webhook, e.g. ``{"url": "https://hooks.slack.com/services/T/B/X"}``."""

    kind = "slack"
    rate_limits = ((1, 1.0),)  # "about one message per second", short bursts tolerated

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        sections = [self._section(a, brief=len(alerts) > 1) for a in alerts[:MAX_ALERTS]]
        if len(alerts) > MAX_ALERTS:
            sections.append(
                {"type": "context", "elements": [{"type": "mrkdwn", "text": render.omitted(len(alerts) - MAX_ALERTS)}]}
            )
        title = render.headline(notification)
        payload = {
            "text": _escape(f"{title}: {alerts[0].summary}"),
            "blocks": [{"type": "header", "text": {"type": "plain_text", "text": render.clip(title, HEADER_CHARS)}}],
            "attachments": [{"color": render.colour(notification), "blocks": sections}],
        }
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        return Outgoing("POST", self.url, {"Content-Type": "application/json; charset=utf-8"}, body)

    @staticmethod
    def _section(alert: Alert, brief: bool) -> dict:
        text = render.clip(render.alert_text(alert, LINES, brief=brief), SECTION_CHARS)
        return {"type": "section", "text": {"type": "mrkdwn", "text": text}}
