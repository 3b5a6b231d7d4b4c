"""Discord webhook: embeds within Discord's limits, 204 on success, JSON `retry_after`, the wire."""

from __future__ import annotations

import json

from alerts.notifiers import Notification, deliver, make_notifier
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_notification, many_alerts

URL = "https://discord.com/api/webhooks/1234567890123456789/AbCdEfGhIjKlMnOpQrStUvWxYz-0123456789_abcdefghijklmnopqrstuvwxyzABCD"


def message(notification: Notification, **config: object) -> dict:
    return json.loads(make_notifier("discord", {"url": URL, **config}).build(notification, NOW).body)


def test_embed_carries_everything(firing: Notification) -> None:
    body = message(firing, username="Flightdeck")
    assert body["content"] == "[FIRING:1] P0 HighLatency"
    assert body["username"] == "Flightdeck"
    assert body["allowed_mentions"] == {"parse": []}
    [embed] = body["embeds"]
    assert embed["title"] == "FIRING · P0 · textcls p99 latency above 250 ms"
    assert embed["color"] == 0xD0021B
    assert embed["url"] == "https://flightdeck.example/alerts/3f2a9c1b7d6e5a40"
    assert embed["timestamp"] == "2024-05-01T12:00:05.120000+00:00"
    assert {f["name"]: f["value"] for f in embed["fields"]} == {
        "Value": "p99 412 ms > 250 ms",
        "Since": "2024-05-01 12:00:05 UTC",
    }
    assert "[Runbook](https://runbooks.example/latency)" in embed["description"]
    assert "```\npython runbooks/rollback.py --model textcls\n```" in embed["description"]


def test_resolved_embed_is_green(resolved: Notification) -> None:
    [embed] = message(resolved)["embeds"]
    assert embed["color"] == 0x2EB886
    assert embed["title"].startswith("RESOLVED · P0")
    assert {f["name"] for f in embed["fields"]} == {"Value", "Since", "Resolved"}


def test_many_alerts_respect_embed_count_and_total_characters() -> None:
    body = message(make_notification(*many_alerts(15, summary="{i} " + "w" * 600)))
    embeds = body["embeds"]
    assert len(embeds) <= 10
    total = sum(
        len(e["title"]) + len(e.get("description", "")) + sum(len(f["name"]) + len(f["value"]) for f in e["fields"])
        for e in embeds
    )
    assert total <= 6000
    assert all(len(e["title"]) <= 256 for e in embeds)
    assert body["content"].endswith(f"…and {15 - len(embeds)} more alerts not shown")


def test_interpret_uses_204_and_json_retry_after() -> None:
    notifier = make_notifier("discord", {"url": URL})
    assert notifier.interpret(204, {}, b"").ok
    assert notifier.interpret(200, {}, b'{"id":"1"}').ok
    limited = notifier.interpret(
        429, {"Retry-After": "2"}, b'{"message":"You are being rate limited.","retry_after":1.234,"global":false}'
    )
    assert (limited.ok, limited.permanent, limited.retry_after_s) == (False, False, 1.234)
    header_only = notifier.interpret(429, {"Retry-After": "3"}, b"")
    assert header_only.retry_after_s == 3.0
    unknown = notifier.interpret(404, {}, b'{"message":"Unknown Webhook","code":10015}')
    assert unknown.permanent and "10015" in unknown.error and "Unknown Webhook" in unknown.error
    invalid = notifier.interpret(400, {}, b'{"code":50035,"message":"Invalid Form Body"}')
    assert invalid.permanent and "50035" in invalid.error


def test_delivers_over_http_and_honours_a_429(firing: Notification) -> None:
    with RecordingServer(204) as server:
        notifier = make_notifier(
            "discord", {"url": server.url + "/api/webhooks/123456789/tokenABC123", "allow_http": True}
        )
        assert deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK).ok
    [request] = server.requests
    assert request.path == "/api/webhooks/123456789/tokenABC123"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.body)["embeds"][0]["color"] == 0xD0021B
    limited_body = b'{"message":"You are being rate limited.","retry_after":0.75,"global":false}'
    with RecordingServer(429, limited_body, {"Retry-After": "1", "Content-Type": "application/json"}) as server:
        notifier = make_notifier(
            "discord", {"url": server.url + "/api/webhooks/123456789/tokenABC123", "allow_http": True}
        )
        result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert (result.ok, result.permanent, result.retry_after_s) == (False, False, 0.75)
