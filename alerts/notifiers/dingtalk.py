"""DingTalk custom robot: a markdown message, signed in the URL when the robot has a secret.

Per DingTalk's "custom robot security settings": the signature is HmacSHA256 with the SECRET as
the key over `timestamp + "\\n" + secret` (timestamp in milliseconds, within an hour), Base64,
then URL-encoded, appended as `&timestamp=...&sign=...`. Note the inversion against Feishu, which
keys the HMAC with `timestamp\\nsecret` and signs nothing. Success is `{"errcode": 0, "errmsg":
"ok"}`, failures carry a non-zero errcode even with HTTP 200 (310000: keyword, signature,
timestamp or IP check failed). Each robot may send 20 messages a minute; going over throttles it
for 10 minutes. `msgUuid` is the message's idempotency key: DingTalk drops a repeat of one it saw.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote_plus

from alerts.notifiers import render
from alerts.notifiers.base import DeliveryResult, Notification, Notifier, Outgoing, header, parse_retry_after

MAX_ALERTS = 10
MAX_TEXT_CHARS = 5000
RATE_LIMITED = {410100, 130101, 660026}  # "sending too fast"; the robot is throttled for 10 minutes
RATE_LIMIT_RETRY_S = 600.0
SYSTEM_BUSY = -1


# DingTalk markdown: a blank line between lines, an emoji for the status.
LINES = render.AlertLines(
    title="{mark} **{state} · {severity}** {summary}",
    value="**Value:** {value}",
    since="**Since:** {since}",
    resolved="**Resolved:** {resolved}",
    run="> **Run:** {command}",
    separator="\n\n",
    marks=("🔴", "✅"),
)


def sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk's signature: HMAC-SHA256 keyed by the secret over `timestamp\\nsecret`, Base64, URL-encoded."""
    digest = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256).digest()
    return quote_plus(base64.b64encode(digest).decode())


class DingTalkNotifier(Notifier):
    """Post to a DingTalk robot, e.g. ``{"url": "https://oapi.dingtalk.com/robot/send?access_token=T", "secret": "SEC..."}``."""

    kind = "dingtalk"
    rate_limits = ((20, 60.0),)
    options = frozenset({"secret"})
    secret_options = frozenset({"secret"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        secret = config.get("secret")
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ValueError("dingtalk: 'secret' must be a non-empty string when given")
        self._secret = secret

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        title = render.headline(notification)

        def text(shown: int) -> str:
            blocks = [f"### {title}", *(render.alert_text(a, LINES, brief=len(alerts) > 1) for a in alerts[:shown])]
            if shown < len(alerts):
                blocks.append(render.omitted(len(alerts) - shown))
            return "\n\n---\n\n".join(blocks)

        markdown = render.fit(text, len(alerts), lambda t: len(t) <= MAX_TEXT_CHARS, MAX_ALERTS)
        payload: dict[str, Any] = {
            "msgtype": "markdown",
            "markdown": {"title": title, "text": render.clip(markdown, MAX_TEXT_CHARS)},
        }
        if notification.key:  # the same on every retry, so a retry after a lost answer does not post twice
            payload["msgUuid"] = notification.key
        url = self.url
        if self._secret:
            timestamp = int(now.timestamp() * 1000)
            url += ("&" if "?" in url else "?") + f"timestamp={timestamp}&sign={sign(self._secret, timestamp)}"
        body = json.dumps(payload, ensure_ascii=False).encode()
        return Outgoing("POST", url, {"Content-Type": "application/json; charset=utf-8"}, body)

    def interpret(self, status: int, headers: Mapping[str, str], body: bytes) -> DeliveryResult:
        """Read DingTalk's `errcode`: 0 delivered, throttling and -1 retry later, anything else is a refusal."""
        document, verdict = self._json_body(status, headers, body)
        if document is None:
            return verdict
        code = document.get("errcode")
        if code == 0:
            return DeliveryResult(ok=True)
        error = self.redact(f"dingtalk errcode {code}: {document.get('errmsg', '')}")
        retry = parse_retry_after(header(headers, "Retry-After"))
        if code in RATE_LIMITED:
            return DeliveryResult(ok=False, retry_after_s=RATE_LIMIT_RETRY_S if retry is None else retry, error=error)
        if code == SYSTEM_BUSY:
            return DeliveryResult(ok=False, retry_after_s=retry, error=error)
        return DeliveryResult(ok=False, permanent=True, error=error)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "signed": bool(self._secret)}
