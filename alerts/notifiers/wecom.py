"""WeCom (WeChat Work) group robot: a markdown message with WeCom's three font colours.

Per developer.work.weixin.qq.com "group robot configuration": POST JSON to the webhook (the `key`
in its query is the credential); markdown content is at most 4,096 UTF-8 bytes; each robot may
send 20 messages a minute. Success is `{"errcode": 0, "errmsg": "ok"}`; failures carry a
non-zero errcode with HTTP 200, 45009 being the frequency limit and -1 "system busy".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime

from alerts.notifiers import render
from alerts.notifiers.base import DeliveryResult, Notification, Notifier, Outgoing, header, parse_retry_after

MAX_ALERTS = 10
MAX_CONTENT_BYTES = 4096
RATE_LIMITED = 45009
RATE_LIMIT_RETRY_S = 60.0  # the robot's budget is counted per minute
SYSTEM_BUSY = -1


# WeCom markdown: quoted detail lines, and its font colours (warning while firing, info once resolved).
LINES = render.AlertLines(
    title='<font color="{mark}">**{state} · {severity}**</font> {summary}',
    value="> Value: `{value}`",
    since='> Since: <font color="comment">{since}</font>',
    resolved='> Resolved: <font color="comment">{resolved}</font>',
    links="> {links}",
    run="> Run: `{command}`",
    marks=("warning", "info"),
)


class WeComNotifier(Notifier):
    """Post to a WeCom group robot, e.g. ``{"url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=K"}``."""

    kind = "wecom"
    rate_limits = ((20, 60.0),)

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        tone = "info" if notification.status == "resolved" else "warning"
        title = f'## <font color="{tone}">{render.headline(notification)}</font>'

        def content(shown: int) -> str:
            blocks = [title, *(render.alert_text(a, LINES, brief=len(alerts) > 1) for a in alerts[:shown])]
            if shown < len(alerts):
                blocks.append(f'<font color="comment">{render.omitted(len(alerts) - shown)}</font>')
            return "\n\n".join(blocks)

        def fits(text: str) -> bool:
            return len(text.encode()) <= MAX_CONTENT_BYTES

        markdown = render.fit(content, len(alerts), fits, MAX_ALERTS)
        payload = {"msgtype": "markdown", "markdown": {"content": render.clip_bytes(markdown, MAX_CONTENT_BYTES)}}
        body = json.dumps(payload, ensure_ascii=False).encode()
        return Outgoing("POST", self.url, {"Content-Type": "application/json; charset=utf-8"}, body)

    def interpret(self, status: int, headers: Mapping[str, str], body: bytes) -> DeliveryResult:
        """Read WeCom's `errcode`: 0 delivered, 45009 and -1 retry later, anything else is a refusal."""
        document, verdict = self._json_body(status, headers, body)
        if document is None:
            return verdict
        code = document.get("errcode")
        if code == 0:
            return DeliveryResult(ok=True)
        error = self.redact(f"wecom errcode {code}: {document.get('errmsg', '')}")
        retry = parse_retry_after(header(headers, "Retry-After"))
        if code == RATE_LIMITED:
            return DeliveryResult(ok=False, retry_after_s=RATE_LIMIT_RETRY_S if retry is None else retry, error=error)
        if code == SYSTEM_BUSY:
            return DeliveryResult(ok=False, retry_after_s=retry, error=error)
        return DeliveryResult(ok=False, permanent=True, error=error)
