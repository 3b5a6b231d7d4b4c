"""The alert text the Feishu, DingTalk, WeCom and Slack notifiers share: one set of lines, each service's markup."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from alerts.notifiers import make_notifier, render
from tests.alerts.notifiers.samples import ENDED, NOW, STARTED, make_alert, make_notification, resolved_alert

PLAIN = render.AlertLines(
    title="{mark}{state} {severity} {summary}",
    value="value {value}",
    since="since {since}",
    resolved="resolved {resolved}",
    run="run {command}",
    marks=("! ", "ok "),
)
URLS = {
    "feishu": "https://open.feishu.cn/open-apis/bot/v2/hook/0123456789abcdef",
    "dingtalk": "https://oapi.dingtalk.com/robot/send?access_token=0123456789abcdef",
    "wecom": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=0123456789abcdef",
    "slack": "https://hooks.slack.com/services/T0/B0/0123456789abcdef",
}


def test_a_firing_alert_shows_every_line_in_order() -> None:
    text = render.alert_text(make_alert(), PLAIN)
    assert text.splitlines() == [
        "! FIRING P0 textcls p99 latency above 250 ms",
        "value p99 412 ms > 250 ms",
        f"since {render.when(STARTED)}",
        "[Console](https://flightdeck.example/alerts/3f2a9c1b7d6e5a40) · [Runbook](https://runbooks.example/latency)",
        "run python runbooks/rollback.py --model textcls",
    ]


def test_a_resolved_alert_adds_its_end_or_replaces_the_since_line() -> None:
    bare = resolved_alert(console_url="", runbook_url="", runbook_command="")
    assert render.alert_text(bare, PLAIN).splitlines()[2:] == [
        f"since {render.when(STARTED)}",
        f"resolved {render.when(ENDED)}",
    ]
    merged = replace(PLAIN, resolved="resolved {resolved} (since {since})", resolved_replaces_since=True)
    assert render.alert_text(bare, merged).splitlines()[2:] == [
        f"resolved {render.when(ENDED)} (since {render.when(STARTED)})"
    ]


@pytest.mark.parametrize("kind", sorted(URLS))
def test_braces_in_alert_text_are_sent_as_written(kind: str) -> None:
    alert = make_alert(annotations={"summary": "queue {depth} over {limit}"}, runbook_command="echo {state}")
    body = make_notifier(kind, {"url": URLS[kind]}).build(make_notification(alert), NOW).body.decode()
    text = json.dumps(json.loads(body), ensure_ascii=False)
    assert "queue {depth} over {limit}" in text and "echo {state}" in text


def test_a_group_of_several_alerts_is_a_short_list_each_linking_to_its_page() -> None:
    assert render.alert_text(make_alert(), PLAIN, brief=True).splitlines() == [
        "! FIRING P0 textcls p99 latency above 250 ms",
        "value p99 412 ms > 250 ms",
        "[Console](https://flightdeck.example/alerts/3f2a9c1b7d6e5a40) · [Runbook](https://runbooks.example/latency)",
    ]


@pytest.mark.parametrize("kind", sorted(URLS))
def test_a_group_renders_every_alert_briefly_and_a_lone_alert_in_full(kind: str) -> None:
    notifier = make_notifier(kind, {"url": URLS[kind]})
    mlp = make_alert(fingerprint="b", annotations={"summary": "mlp p99 latency above 250 ms"})
    group = json.dumps(
        json.loads(notifier.build(make_notification(make_alert(), resolved_alert(fingerprint="c"), mlp), NOW).body),
        ensure_ascii=False,
    )
    alone = json.dumps(json.loads(notifier.build(make_notification(make_alert()), NOW).body), ensure_ascii=False)
    assert "mlp p99 latency" in group and group.count("textcls p99 latency") >= 2
    assert "rollback.py" not in group and "rollback.py" in alone
