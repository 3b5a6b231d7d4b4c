"""Feishu / Lark custom bot: card payload, signature, `code` in the body, and the wire."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from alerts.notifiers import Notification, deliver, make_notifier
from alerts.notifiers.feishu import MAX_BODY_BYTES
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_notification, many_alerts

URL = "https://open.feishu.cn/open-apis/bot/v2/hook/5e3d587e-d78e-4a07-bd07-265f269f86fd"
SECRET = "nIMtb7r3N9pkXyXdtAbx6e"


def expected_sign(timestamp: int, secret: str) -> str:
    # Feishu's guide: `timestamp + "\n" + secret` is the HMAC-SHA256 key; the message is empty.
    mac = hmac.new(f"{timestamp}\n{secret}".encode(), digestmod=hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("utf-8")


def test_signed_body_carries_timestamp_in_seconds_and_sign(firing: Notification) -> None:
    body = json.loads(make_notifier("feishu", {"url": URL, "secret": SECRET}).build(firing, NOW).body)
    timestamp = int(NOW.timestamp())
    assert body["timestamp"] == str(timestamp) == "1714564860"
    assert body["sign"] == expected_sign(timestamp, SECRET)


def test_unsigned_bot_gets_no_signature_fields(firing: Notification) -> None:
    body = json.loads(make_notifier("feishu", {"url": URL}).build(firing, NOW).body)
    assert "sign" not in body and "timestamp" not in body


def test_card_shows_severity_summary_value_links_and_command(firing: Notification) -> None:
    body = json.loads(make_notifier("feishu", {"url": URL}).build(firing, NOW).body)
    assert body["msg_type"] == "interactive"
    card = body["card"]
    assert card["schema"] == "2.0"
    assert card["header"] == {"title": {"tag": "plain_text", "content": "[FIRING:1] P0 HighLatency"}, "template": "red"}
    [element] = card["body"]["elements"]
    assert element["tag"] == "markdown"
    text = element["content"]
    assert "**FIRING · P0** textcls p99 latency above 250 ms" in text
    assert "**Value:** p99 412 ms &#62; 250 ms" in text
    assert "[Console](https://flightdeck.example/alerts/3f2a9c1b7d6e5a40)" in text
    assert "[Runbook](https://runbooks.example/latency)" in text
    assert "```\npython runbooks/rollback.py --model textcls\n```" in text


def test_resolved_card_is_green(resolved: Notification) -> None:
    card = json.loads(make_notifier("feishu", {"url": URL}).build(resolved, NOW).body)["card"]
    assert card["header"]["template"] == "green"
    assert card["header"]["title"]["content"] == "[RESOLVED] P0 HighLatency"
    assert "**RESOLVED · P0**" in card["body"]["elements"][0]["content"]


def test_large_group_fits_in_20_kb_and_counts_what_was_left_out() -> None:
    notification = make_notification(*many_alerts(40, summary="{i} " + "延迟过高 " * 60))
    body = make_notifier("feishu", {"url": URL, "secret": SECRET}).build(notification, NOW).body
    assert len(body) <= MAX_BODY_BYTES
    elements = json.loads(body)["card"]["body"]["elements"]
    shown = sum(1 for e in elements if e["tag"] == "markdown" and "FIRING" in e["content"])
    assert 1 <= shown < 40
    assert elements[-1]["content"] == f"…and {40 - shown} more alerts not shown"


def test_interpret_reads_code_in_the_body() -> None:
    notifier = make_notifier("feishu", {"url": URL, "secret": SECRET})
    assert notifier.interpret(200, {}, b'{"code":0,"data":{},"msg":"success"}').ok
    assert notifier.interpret(200, {}, b'{"StatusCode":0,"StatusMessage":"success"}').ok
    bad_sign = notifier.interpret(
        200, {}, b'{"code":19021,"msg":"sign match fail or timestamp is not within one hour from current time"}'
    )
    assert (bad_sign.ok, bad_sign.permanent) == (False, True)
    assert "19021" in bad_sign.error
    keyword = notifier.interpret(200, {}, b'{"code":19024,"msg":"Key Words Not Found"}')
    assert keyword.permanent and "Key Words Not Found" in keyword.error
    limited = notifier.interpret(200, {}, b'{"code":11232,"msg":"frequency limited"}')
    assert (limited.ok, limited.permanent, limited.retry_after_s) == (False, False, 60.0)
    garbled = notifier.interpret(200, {}, b"<html>gateway</html>")
    assert not garbled.ok and not garbled.permanent


def test_delivers_signed_card_over_http(firing: Notification) -> None:
    with RecordingServer(200, b'{"code":0,"data":{},"msg":"success"}') as server:
        config = {"url": server.url + "/open-apis/bot/v2/hook/5e3d587e-d78e", "secret": SECRET, "allow_http": True}
        result = deliver(make_notifier("feishu", config), firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert result.ok
    [request] = server.requests
    assert request.path == "/open-apis/bot/v2/hook/5e3d587e-d78e"
    sent = json.loads(request.body)
    assert sent["sign"] == expected_sign(int(sent["timestamp"]), SECRET)
    assert sent["card"]["header"]["template"] == "red"


def test_a_200_with_an_error_code_is_a_failure_on_the_wire(firing: Notification) -> None:
    with RecordingServer(200, b'{"code":9499,"msg":"Bad Request","data":{}}') as server:
        result = deliver(
            make_notifier("feishu", {"url": server.url + "/hook", "allow_http": True}), firing, NOW, targets=LOOPBACK
        )
    assert (result.ok, result.permanent) == (False, True)
    assert "9499" in result.error
