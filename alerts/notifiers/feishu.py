"""Feishu / Lark custom bot: an interactive card (JSON 2.0), signed when the bot has a secret.

Per open.feishu.cn "custom bot usage guide": the signature is HmacSHA256 with
`timestamp + "\\n" + secret` as the KEY over an empty message, Base64, sent as `timestamp`
(seconds, within an hour) and `sign` in the JSON body. Success is `{"code": 0, ...}`; failures
carry a non-zero code, even with HTTP 200: 9499 bad request, 19021 signature or timestamp,
19022 IP not allowed, 19024 keyword missing, 11232 rate limited (100 per minute and 5 per second
per bot). The request body may not exceed 20 KB.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from alerts.notifiers import render
from alerts.notifiers.base import DeliveryResult, Notification, Notifier, Outgoing, header, parse_retry_after

MAX_ALERTS = 20
MAX_BODY_BYTES = 20_000
RATE_LIMITED = 11232
RATE_LIMIT_RETRY_S = 60.0  # the bot's budget is counted per minute
TEMPLATES = {"P0": "red", "P1": "orange", "P2": "yellow"}


def sign(secret: str, timestamp: int) -> str:
    """Feishu's signature: HMAC-SHA256 keyed by `timestamp\\nsecret` over nothing, Base64."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def _escape(text: str) -> str:
    return text.replace("<", "&#60;").replace(">", "&#62;")


# Card markdown; Feishu reads < and > as tags, so alert text has them escaped (the command sits in a code block).
LINES = render.AlertLines(
    title="**{state} · {severity}** {summary}",
    value="**Value:** {value}",
    since="**Since:** {since}",
    resolved="**Resolved:** {resolved}",
    run="**Run:**\n```\n{command}\n```",
    escape=_escape,
)


class FeishuNotifier(Notifier):
    """Post a card to a Feishu/Lark bot, e.g. ``{"url": "https://open.feishu.cn/open-apis/bot/v2/hook/ID", "secret": "S"}``."""

    kind = "feishu"
    rate_limits = ((5, 1.0), (100, 60.0))
    options = frozenset({"secret"})
    secret_options = frozenset({"secret"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        secret = config.get("secret")
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ValueError("feishu: 'secret' must be a non-empty string when given")
        self._secret = secret

    def build(self, notification: Notification, now: datetime) -> Outgoing:
        alerts = render.ordered(notification.alerts)
        template = "green" if notification.status == "resolved" else TEMPLATES[render.top_severity(notification)]
        signature = {}
        if self._secret:
            timestamp = int(now.timestamp())
            signature = {"timestamp": str(timestamp), "sign": sign(self._secret, timestamp)}

        def body(shown: int) -> bytes:
            elements: list[dict] = []
            for alert in alerts[:shown]:
                elements += [
                    {"tag": "markdown", "content": render.alert_text(alert, LINES, brief=len(alerts) > 1)},
                    {"tag": "hr"},
                ]
            elements.pop()
            if shown < len(alerts):
                elements.append({"tag": "markdown", "content": render.omitted(len(alerts) - shown)})
            card = {
                "schema": "2.0",
                "header": {
                    "title": {"tag": "plain_text", "content": render.headline(notification)},
                    "template": template,
                },
                "body": {"elements": elements},
            }
            return json.dumps({**signature, "msg_type": "interactive", "card": card}, ensure_ascii=False).encode()

        payload = render.fit(body, len(alerts), lambda b: len(b) <= MAX_BODY_BYTES, MAX_ALERTS)
        return Outgoing("POST", self.url, {"Content-Type": "application/json; charset=utf-8"}, payload)

    def interpret(self, status: int, headers: Mapping[str, str], body: bytes) -> DeliveryResult:
        """Read Feishu's `code`: 0 delivered, 11232 retry later, anything else is a refusal."""
        document, verdict = self._json_body(status, headers, body)
        if document is None:
            return verdict
        code = document.get("code", document.get("StatusCode"))
        if code == 0:
            return DeliveryResult(ok=True)
        error = self.redact(f"feishu code {code}: {document.get('msg', document.get('StatusMessage', ''))}")
        if code == RATE_LIMITED:
            retry = parse_retry_after(header(headers, "Retry-After"))
            return DeliveryResult(ok=False, retry_after_s=RATE_LIMIT_RETRY_S if retry is None else retry, error=error)
        return DeliveryResult(ok=False, permanent=True, error=error)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "signed": bool(self._secret)}
