"""Teams Workflows webhook: Adaptive Card in a message envelope, 202 with an empty body, the wire."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from alerts.notifiers import Notification, deliver, make_notifier
from alerts.notifiers.teams import MAX_BODY_BYTES
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_notification, many_alerts

URL = (
    "https://prod-42.westeurope.logic.azure.com:443/workflows/0123456789abcdef0123456789abcdef/triggers/manual/paths/"
    "invoke?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig=AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFG"
)


def card(notification: Notification) -> dict:
    message = json.loads(make_notifier("teams", {"url": URL}).build(notification, NOW).body)
    assert message["type"] == "message"
    [attachment] = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["contentUrl"] is None
    return attachment["content"]


def test_adaptive_card_carries_everything(firing: Notification) -> None:
    content = card(firing)
    assert content["type"] == "AdaptiveCard"
    assert content["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    assert content["version"] == "1.4"
    heading, container = content["body"]
    assert heading["text"] == "[FIRING:1] P0 HighLatency" and heading["color"] == "Attention"
    assert container["type"] == "Container"
    summary, facts, links, command = container["items"]
    assert summary["text"] == "**FIRING** textcls p99 latency above 250 ms"
    assert {f["title"]: f["value"] for f in facts["facts"]} == {
        "Severity": "P0",
        "Value": "p99 412 ms > 250 ms",
        "Since": "2024-05-01 12:00:05 UTC",
    }
    assert (
        links["text"]
        == "[Console](https://flightdeck.example/alerts/3f2a9c1b7d6e5a40) · [Runbook](https://runbooks.example/latency)"
    )
    assert command == {
        "type": "TextBlock",
        "text": "python runbooks/rollback.py --model textcls",
        "fontType": "Monospace",
        "wrap": True,
    }
    assert [a["url"] for a in content["actions"]] == [
        "https://flightdeck.example/alerts/3f2a9c1b7d6e5a40",
        "https://runbooks.example/latency",
    ]
    assert all(a["type"] == "Action.OpenUrl" for a in content["actions"])


def test_resolved_card_is_good_green(resolved: Notification) -> None:
    content = card(resolved)
    assert content["body"][0]["color"] == "Good"
    assert content["body"][0]["text"] == "[RESOLVED] P0 HighLatency"
    facts = {f["title"]: f["value"] for f in content["body"][1]["items"][1]["facts"]}
    assert facts["Resolved"] == "2024-05-01 12:30:00 UTC"


def test_message_stays_under_28_kb() -> None:
    notification = make_notification(*many_alerts(60, summary="{i} " + "z" * 290))
    body = make_notifier("teams", {"url": URL}).build(notification, NOW).body
    assert len(body) <= MAX_BODY_BYTES
    items = json.loads(body)["attachments"][0]["content"]["body"]
    assert items[-1]["text"].endswith("more alerts not shown")


def test_interpret_202_with_an_empty_body_is_delivered() -> None:
    notifier = make_notifier("teams", {"url": URL})
    assert notifier.interpret(202, {}, b"").ok
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    limited = notifier.interpret(429, {"retry-after": later}, b"")
    assert not limited.ok and not limited.permanent and 100 < limited.retry_after_s <= 120
    rejected = notifier.interpret(400, {}, b'{"error":{"code":"TriggerInputSchemaMismatch","message":"bad"}}')
    assert rejected.permanent and "TriggerInputSchemaMismatch" in rejected.error


def test_delivers_over_http_and_accepts_202(firing: Notification) -> None:
    with RecordingServer(202, b"") as server:
        url = f"{server.url}/workflows/0123456789abcdef/triggers/manual/paths/invoke?api-version=2016-06-01&sig=Zz0123456789"
        notifier = make_notifier("teams", {"url": url, "allow_http": True})
        result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert result.ok
    [request] = server.requests
    assert request.path.endswith("sig=Zz0123456789")
    assert json.loads(request.body)["attachments"][0]["content"]["type"] == "AdaptiveCard"
