"""Chat notifiers: one small adapter per service over `base.Notifier`, and the registry of kinds.

Example::

    notifier = make_notifier("feishu", {"url": "https://open.feishu.cn/open-apis/bot/v2/hook/ID", "secret": "S"})
    result = deliver(notifier, notification, now=datetime.now(UTC))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from alerts.notifiers.alertmanager import AlertmanagerWebhookNotifier
from alerts.notifiers.base import Alert, DeliveryResult, Notification, Notifier, Outgoing
from alerts.notifiers.delivery import deliver, send
from alerts.notifiers.dingtalk import DingTalkNotifier
from alerts.notifiers.discord import DiscordNotifier
from alerts.notifiers.feishu import FeishuNotifier
from alerts.notifiers.slack import SlackNotifier
from alerts.notifiers.teams import TeamsNotifier
from alerts.notifiers.wecom import WeComNotifier

NOTIFIERS: dict[str, type[Notifier]] = {
    cls.kind: cls
    for cls in (
        SlackNotifier,
        FeishuNotifier,
        DingTalkNotifier,
        WeComNotifier,
        TeamsNotifier,
        DiscordNotifier,
        AlertmanagerWebhookNotifier,
    )
}


def make_notifier(kind: str, config: Mapping[str, Any]) -> Notifier:
    """Build the notifier for `kind` from its config; ValueError names what is wrong (never a secret)."""
    cls = NOTIFIERS.get(kind)
    if cls is None:
        raise ValueError(f"unknown notifier kind {kind!r}; expected one of {', '.join(sorted(NOTIFIERS))}")
    return cls(config)


__all__ = [
    "NOTIFIERS",
    "Alert",
    "DeliveryResult",
    "Notification",
    "Notifier",
    "Outgoing",
    "deliver",
    "make_notifier",
    "send",
]
