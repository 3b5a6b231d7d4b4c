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


class SlackNotifier(Notifier):
    """Post to a Slack incoming webhook, e.g. ``{"url": "https://hooks.slack.com/services/T/B/X"}``."""

    kind = "slack"
    rate_limits = ((1, 1.0),)  # "about one message per second", short bursts tolerated

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        sections = [self._section(a) for a in alerts[:MAX_ALERTS]]
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
    def _section(alert: Alert) -> dict:
        lines = [
            f"*{render.state_word(alert)}* · *{alert.severity}* · {_escape(render.clip(alert.summary, render.SUMMARY_CHARS))}",
            f"*Value:* `{_escape(render.clip(alert.shown_value, render.VALUE_CHARS))}`",
        ]
        if alert.status == "resolved" and alert.ends_at:
            lines.append(f"*Resolved:* {render.when(alert.ends_at)} (since {render.when(alert.starts_at)})")
        else:
            lines.append(f"*Since:* {render.when(alert.starts_at)}")
        links = [_link(u, label) for u, label in ((alert.console_url, "Console"), (alert.runbook_url, "Runbook")) if u]
        if links:
            lines.append(" · ".join(links))
        if alert.runbook_command:
            lines.append(f"*Run:*\n```{_escape(render.clip(alert.runbook_command, render.COMMAND_CHARS))}```")
        text = render.clip("\n".join(lines), SECTION_CHARS)
        return {"type": "section", "text": {"type": "mrkdwn", "text": text}}
