"""WeCom group robot: markdown payload within 4,096 bytes, `errcode` (45009 throttled), and the wire."""

from __future__ import annotations

import json

from alerts.notifiers import Notification, deliver, make_notifier
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_notification, many_alerts

KEY = "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"
URL = f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={KEY}"


def content(notification: Notification) -> str:
    body = json.loads(make_notifier("wecom", {"url": URL}).build(notification, NOW).body)
    assert body["msgtype"] == "markdown"
    assert set(body) == {"msgtype", "markdown"}
    return body["markdown"]["content"]


def test_markdown_carries_severity_summary_value_links_and_command(firing: Notification) -> None:
    text = content(firing)
    assert text.startswith('## <font color="warning">[FIRING:1] P0 HighLatency</font>')
    assert '<font color="warning">**FIRING · P0**</font> textcls p99 latency above 250 ms' in text
    assert "> Value: `p99 412 ms > 250 ms`" in text
    assert (
        "> [Console](https://flightdeck.example/alerts/3f2a9c1b7d6e5a40) · [Runbook](https://runbooks.example/latency)"
        in text
    )
    assert "> Run: `python runbooks/rollback.py --model textcls`" in text


def test_resolved_uses_wecoms_green(resolved: Notification) -> None:
    text = content(resolved)
    assert text.startswith('## <font color="info">[RESOLVED] P0 HighLatency</font>')
    assert '<font color="info">**RESOLVED · P0**</font>' in text


def test_content_stays_within_4096_utf8_bytes() -> None:
    text = content(make_notification(*many_alerts(25, summary="模型 {i} 延迟过高，请立即处理" * 8)))
    assert len(text.encode("utf-8")) <= 4096
    shown = text.count("**FIRING · P1**")
    assert 1 <= shown < 25
    assert f"…and {25 - shown} more alerts not shown" in text


def test_interpret_reads_errcode() -> None:
    notifier = make_notifier("wecom", {"url": URL})
    assert notifier.interpret(200, {}, b'{"errcode":0,"errmsg":"ok"}').ok
    limited = notifier.interpret(200, {}, b'{"errcode":45009,"errmsg":"api freq out of limit"}')
    assert (limited.ok, limited.permanent, limited.retry_after_s) == (False, False, 60.0)
    invalid = notifier.interpret(200, {}, b'{"errcode":93000,"errmsg":"invalid webhook url"}')
    assert (invalid.ok, invalid.permanent) == (False, True)
    assert "93000" in invalid.error


def test_delivers_over_http(firing: Notification) -> None:
    with RecordingServer(200, b'{"errcode":0,"errmsg":"ok"}') as server:
        notifier = make_notifier("wecom", {"url": f"{server.url}/cgi-bin/webhook/send?key={KEY}", "allow_http": True})
        result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert result.ok
    [request] = server.requests
    assert request.path == f"/cgi-bin/webhook/send?key={KEY}"
    assert request.body == notifier.build(firing, NOW).body


def test_a_200_with_45009_is_retried_later_on_the_wire(firing: Notification) -> None:
    with RecordingServer(200, b'{"errcode":45009,"errmsg":"api freq out of limit"}') as server:
        result = deliver(
            make_notifier("wecom", {"url": server.url + "/send?key=k", "allow_http": True}),
            firing,
            NOW,
            targets=LOOPBACK,
        )
    assert (result.ok, result.permanent, result.retry_after_s) == (False, False, 60.0)
