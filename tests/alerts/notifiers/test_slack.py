"""Slack incoming webhook: Block Kit payload, status-code errors, and the wire."""

from __future__ import annotations

import json

from alerts.notifiers import Notification, deliver, make_notifier
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_alert, make_notification, many_alerts

URL = "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdEFGHijklMNOPqrstUVWX"


def payload(notification: Notification) -> dict:
    return json.loads(make_notifier("slack", {"url": URL}).build(notification, NOW).body)


def test_firing_message_carries_severity_summary_value_links_and_command(firing: Notification) -> None:
    message = payload(firing)
    assert message["text"] == "[FIRING:1] P0 HighLatency: textcls p99 latency above 250 ms"
    assert message["blocks"] == [
        {"type": "header", "text": {"type": "plain_text", "text": "[FIRING:1] P0 HighLatency"}}
    ]
    [attachment] = message["attachments"]
    assert attachment["color"] == "#D0021B"
    [section] = attachment["blocks"]
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    text = section["text"]["text"]
    assert text.startswith("*FIRING* · *P0* · textcls p99 latency above 250 ms")
    assert "*Value:* `p99 412 ms &gt; 250 ms`" in text  # Slack wants &, < and > escaped
    assert "<https://flightdeck.example/alerts/3f2a9c1b7d6e5a40|Console>" in text
    assert "<https://runbooks.example/latency|Runbook>" in text
    assert "```python runbooks/rollback.py --model textcls```" in text


def test_resolved_message_is_green_and_says_resolved(resolved: Notification) -> None:
    message = payload(resolved)
    assert message["blocks"][0]["text"]["text"] == "[RESOLVED] P0 HighLatency"
    assert message["attachments"][0]["color"] == "#2EB886"
    text = message["attachments"][0]["blocks"][0]["text"]["text"]
    assert text.startswith("*RESOLVED* · *P0*")
    assert "*Resolved:* 2024-05-01 12:30:00 UTC" in text


def test_user_text_cannot_inject_slack_markup() -> None:
    alert = make_alert(annotations={"summary": "<!channel> & <https://evil.example|click>"})
    text = payload(make_notification(alert))["attachments"][0]["blocks"][0]["text"]["text"]
    assert "<!channel>" not in text
    assert "&lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;" in text


def test_many_alerts_stay_within_block_limits_and_say_how_many_were_left_out() -> None:
    message = payload(make_notification(*many_alerts(27, summary="x" * 5000)))
    blocks = message["attachments"][0]["blocks"]
    assert len(blocks) <= 50
    assert [b["type"] for b in blocks].count("section") == 20
    assert blocks[-1] == {"type": "context", "elements": [{"type": "mrkdwn", "text": "…and 7 more alerts not shown"}]}
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")


def test_interpret_follows_slack_status_codes() -> None:
    notifier = make_notifier("slack", {"url": URL})
    assert notifier.interpret(200, {}, b"ok").ok
    limited = notifier.interpret(429, {"Retry-After": "7"}, b"")
    assert (limited.ok, limited.permanent, limited.retry_after_s) == (False, False, 7.0)
    archived = notifier.interpret(410, {}, b"channel_is_archived")
    assert archived.permanent and "channel_is_archived" in archived.error
    assert notifier.interpret(404, {}, b"channel_not_found").permanent
    assert notifier.interpret(400, {}, b"invalid_payload").permanent
    rollup = notifier.interpret(500, {}, b"rollup_error")
    assert not rollup.ok and not rollup.permanent


def test_delivers_over_http(firing: Notification) -> None:
    with RecordingServer(200, b"ok") as server:
        notifier = make_notifier("slack", {"url": server.url + "/services/T0123/B0456/token123456", "allow_http": True})
        result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert result.ok
    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/services/T0123/B0456/token123456"
    assert request.headers["content-type"] == "application/json; charset=utf-8"
    assert request.body == notifier.build(firing, NOW).body
    assert json.loads(request.body)["attachments"][0]["color"] == "#D0021B"
