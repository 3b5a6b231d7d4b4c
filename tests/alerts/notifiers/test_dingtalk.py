"""DingTalk custom robot: markdown payload, URL signature (not Feishu's), `errcode`, and the wire."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse

from alerts.notifiers import Notification, deliver, feishu, make_notifier
from alerts.notifiers.dingtalk import MAX_TEXT_CHARS, sign
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_notification, many_alerts

TOKEN = "ff6cd723bdb4455fe18a1ba30dbeff007f5ab0c1d2e3f4a5b6c7d8e9f0a1b2c3"
URL = f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}"
SECRET = "SEC5a3ecf88f2b3eb50db30ecfc00f53033ac909c99bf7f88fd612bda89d7f3a9dc"


def expected_sign(timestamp_ms: int, secret: str) -> str:
    # DingTalk's guide: HmacSHA256 keyed by the secret over `timestamp + "\n" + secret`, Base64.
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("utf-8")


def query(url: str) -> dict[str, list[str]]:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)


def test_signature_goes_in_the_query_with_a_millisecond_timestamp(firing: Notification) -> None:
    outgoing = make_notifier("dingtalk", {"url": URL, "secret": SECRET}).build(firing, NOW)
    params = query(outgoing.url)
    timestamp = int(NOW.timestamp() * 1000)
    assert params["access_token"] == [TOKEN]
    assert params["timestamp"] == [str(timestamp)] == ["1714564860000"]
    assert params["sign"] == [expected_sign(timestamp, SECRET)]  # parse_qs undoes the URL-encoding
    raw_sign = outgoing.url.split("&sign=")[1]
    assert raw_sign == urllib.parse.quote_plus(expected_sign(timestamp, SECRET))
    assert "+" not in raw_sign and "/" not in raw_sign and "=" not in raw_sign


def test_dingtalk_signs_differently_from_feishu() -> None:
    timestamp = 1714564860000
    dingtalk = urllib.parse.unquote_plus(sign(SECRET, timestamp))
    assert dingtalk == expected_sign(timestamp, SECRET)
    assert dingtalk != feishu.sign(SECRET, timestamp)
    # Feishu keys the HMAC with `timestamp\nsecret` and signs nothing; DingTalk does the reverse.
    swapped = hmac.new(f"{timestamp}\n{SECRET}".encode(), b"", hashlib.sha256).digest()
    assert feishu.sign(SECRET, timestamp) == base64.b64encode(swapped).decode()


def test_unsigned_robot_keeps_its_url(firing: Notification) -> None:
    outgoing = make_notifier("dingtalk", {"url": URL}).build(firing, NOW)
    assert outgoing.url == URL


def test_markdown_message_carries_everything(firing: Notification) -> None:
    body = json.loads(make_notifier("dingtalk", {"url": URL}).build(firing, NOW).body)
    assert body["msgtype"] == "markdown"
    assert body["markdown"]["title"] == "[FIRING:1] P0 HighLatency"
    text = body["markdown"]["text"]
    assert text.startswith("### [FIRING:1] P0 HighLatency")
    assert "🔴 **FIRING · P0** textcls p99 latency above 250 ms" in text
    assert "**Value:** p99 412 ms > 250 ms" in text
    assert "[Console](https://flightdeck.example/alerts/3f2a9c1b7d6e5a40)" in text
    assert "[Runbook](https://runbooks.example/latency)" in text
    assert "> **Run:** python runbooks/rollback.py --model textcls" in text


def test_resolved_message_says_resolved(resolved: Notification) -> None:
    text = json.loads(make_notifier("dingtalk", {"url": URL}).build(resolved, NOW).body)["markdown"]["text"]
    assert text.startswith("### [RESOLVED] P0 HighLatency")
    assert "✅ **RESOLVED · P0**" in text and "**Resolved:** 2024-05-01 12:30:00 UTC" in text


def test_long_groups_are_cut_to_the_text_limit_with_a_count() -> None:
    notification = make_notification(*many_alerts(30, summary="{i} " + "y" * 280))
    text = json.loads(make_notifier("dingtalk", {"url": URL}).build(notification, NOW).body)["markdown"]["text"]
    assert len(text) <= MAX_TEXT_CHARS
    shown = text.count("**FIRING · P1**")
    assert text.endswith(f"…and {30 - shown} more alerts not shown")


def test_interpret_reads_errcode() -> None:
    notifier = make_notifier("dingtalk", {"url": URL, "secret": SECRET})
    assert notifier.interpret(200, {}, b'{"errcode":0,"errmsg":"ok"}').ok
    mismatch = notifier.interpret(200, {}, b'{"errcode":310000,"errmsg":"sign not match"}')
    assert (mismatch.ok, mismatch.permanent) == (False, True)
    assert "310000" in mismatch.error and "sign not match" in mismatch.error
    for code in (410100, 130101, 660026):
        limited = notifier.interpret(200, {}, json.dumps({"errcode": code, "errmsg": "send too fast"}).encode())
        assert (limited.ok, limited.permanent, limited.retry_after_s) == (False, False, 600.0)
    busy = notifier.interpret(200, {}, b'{"errcode":-1,"errmsg":"system busy"}')
    assert not busy.ok and not busy.permanent


def test_delivers_over_http_with_the_signature_in_the_query(firing: Notification) -> None:
    with RecordingServer(200, b'{"errcode":0,"errmsg":"ok"}') as server:
        config = {"url": f"{server.url}/robot/send?access_token={TOKEN}", "secret": SECRET, "allow_http": True}
        result = deliver(make_notifier("dingtalk", config), firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert result.ok
    [request] = server.requests
    params = query(request.path)
    assert params["access_token"] == [TOKEN]
    assert params["sign"] == [expected_sign(int(params["timestamp"][0]), SECRET)]
    assert json.loads(request.body)["msgtype"] == "markdown"


def test_the_idempotency_key_travels_as_msguuid_the_same_on_every_build() -> None:
    notifier = make_notifier("dingtalk", {"url": URL, "secret": SECRET})
    keyed = make_notification(key="5f0c8e1d2b3a4c5d6e7f8091a2b3c4d5")
    first, again = (json.loads(notifier.build(keyed, NOW).body) for _ in range(2))
    assert first["msgUuid"] == again["msgUuid"] == "5f0c8e1d2b3a4c5d6e7f8091a2b3c4d5"
    assert "msgUuid" not in json.loads(notifier.build(make_notification(), NOW).body)
