"""The shared contract: config validation, the registry, masking, Retry-After, default verdicts."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from alerts.notifiers import NOTIFIERS, Notification, make_notifier
from alerts.notifiers.base import Outgoing, mask_url, parse_retry_after
from tests.alerts.notifiers.samples import NOW, make_alert, make_notification

TOKEN = "xoxb9Q2tT7vS4kLm1nP0"
SECRET = "SECf00dbabe1234"
CONFIGS = {
    "slack": {"url": f"https://hooks.slack.com/services/T0123ABCD/B0456EFGH/{TOKEN}"},
    "feishu": {"url": f"https://open.feishu.cn/open-apis/bot/v2/hook/{TOKEN}", "secret": SECRET},
    "dingtalk": {"url": f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}", "secret": SECRET},
    "wecom": {"url": f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={TOKEN}"},
    "teams": {
        "url": f"https://prod-1.westus.logic.azure.com/workflows/abc123def456/triggers/manual/paths/invoke?sig={TOKEN}"
    },
    "discord": {"url": f"https://discord.com/api/webhooks/123456789012345678/{TOKEN}"},
    "webhook": {"url": f"https://hooks.example/am/{TOKEN}", "bearer_token": SECRET},
}


def test_every_kind_is_registered_once() -> None:
    assert sorted(NOTIFIERS) == sorted(CONFIGS)
    assert all(cls.kind == kind for kind, cls in NOTIFIERS.items())


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_describe_and_repr_never_show_secrets(kind: str) -> None:
    notifier = make_notifier(kind, CONFIGS[kind])
    shown = json.dumps(notifier.describe()) + repr(notifier) + repr(notifier.build(make_notification(), NOW))
    assert TOKEN not in shown and SECRET not in shown
    assert notifier.describe()["kind"] == kind
    assert notifier.describe()["url"].endswith("/***")


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_error_texts_never_show_secrets(kind: str) -> None:
    config = CONFIGS[kind]
    notifier = make_notifier(kind, config)
    secrets = [TOKEN] + [SECRET] * (SECRET in config.values())
    echo = f"bad request to {config['url']} with {' '.join(secrets)}".encode()
    for status in (400, 500):
        result = notifier.interpret(status, {}, echo)
        assert not result.ok and result.error.startswith(f"HTTP {status}")
        assert "bad request" not in result.error  # the answer's body is never echoed
        assert all(secret not in result.error for secret in secrets)


def test_documented_send_rates_are_declared_for_pacing() -> None:
    assert NOTIFIERS["dingtalk"].rate_limits == ((20, 60.0),) == NOTIFIERS["wecom"].rate_limits
    assert NOTIFIERS["feishu"].rate_limits == ((5, 1.0), (100, 60.0))
    assert NOTIFIERS["discord"].rate_limits == ()
    assert make_notifier("slack", CONFIGS["slack"]).describe()["rate_limits"] == [[1, 1.0]]


def test_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown notifier kind 'pagerduty'; expected one of dingtalk, discord"):
        make_notifier("pagerduty", {"url": "https://x.example"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "needs a webhook 'url'"),
        ({"url": "  "}, "needs a webhook 'url'"),
        ({"url": f"http://hooks.slack.com/services/{TOKEN}"}, "must use https"),
        ({"url": f"http://hooks.slack.com/services/{TOKEN}", "allow_http": True}, "must use https"),
        ({"url": f"http://127.0.0.1:9/{TOKEN}"}, "must use https"),
        ({"url": f"ftp://127.0.0.1/{TOKEN}", "allow_http": True}, "must use https"),
        ({"url": f"https:///{TOKEN}"}, "has no host"),
        ({"url": f"https://hooks.example:99999/{TOKEN}"}, "malformed"),
        ({"url": "https://hooks.example/x", "chanel": "#ops"}, r"unknown config keys \['chanel'\]"),
        ("https://hooks.example/x", "config must be a mapping"),
    ],
)
def test_bad_config_is_refused_without_echoing_it(config: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        make_notifier("slack", config)
    assert TOKEN not in str(caught.value)


def test_loopback_http_is_allowed_only_when_asked() -> None:
    assert make_notifier("slack", {"url": "http://127.0.0.1:8080/hook", "allow_http": True}).url.startswith("http://")
    assert make_notifier("slack", {"url": "http://[::1]:8080/hook", "allow_http": True})


@pytest.mark.parametrize("kind", ["feishu", "dingtalk"])
def test_secret_must_be_a_non_empty_string(kind: str) -> None:
    with pytest.raises(ValueError, match="'secret' must be a non-empty string"):
        make_notifier(kind, {**CONFIGS[kind], "secret": 12345})


def test_percent_encoded_signatures_are_redacted_in_both_forms() -> None:
    notifier = make_notifier("teams", {"url": "https://h.example/invoke?sp=%2Ftriggers%2Frun&sig=Ab%2Fcd%2B123456"})
    text = notifier.redact("sig Ab%2Fcd%2B123456 or Ab/cd+123456 on /triggers/run")
    assert text == "sig *** or *** on /triggers/run"


def test_mask_url_keeps_only_scheme_host_and_port() -> None:
    assert mask_url(f"https://hooks.slack.com/services/T0/B0/{TOKEN}") == "https://hooks.slack.com/***"
    assert mask_url(f"http://127.0.0.1:8080/x?key={TOKEN}") == "http://127.0.0.1:8080/***"
    assert repr(Outgoing("POST", f"https://h.example/{TOKEN}", {"Authorization": SECRET}, b"{}")) == (
        "Outgoing(POST https://h.example/***, 2 bytes)"
    )


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(format_datetime(NOW + timedelta(seconds=90), usegmt=True), now=NOW) == 90.0
    assert parse_retry_after("Wed, 01 May 2024 12:00:00 GMT", now=NOW) == 0.0  # already past
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_default_verdicts() -> None:
    notifier = make_notifier("slack", CONFIGS["slack"])
    assert notifier.interpret(204, {}, b"").ok
    for status in (408, 429, 502, 503):
        result = notifier.interpret(status, {"retry-after": "4"}, b"busy")
        assert (result.ok, result.permanent, result.retry_after_s) == (False, False, 4.0)
    forbidden = notifier.interpret(403, {}, b"action_prohibited")
    assert (forbidden.ok, forbidden.permanent, forbidden.error) == (False, True, "HTTP 403: action_prohibited")
    assert notifier.interpret(302, {"Location": "https://elsewhere.example"}, b"").permanent


def test_notification_and_alert_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="at least one alert"):
        make_notification(alerts=[])
    with pytest.raises(ValueError, match="alerts make it 'firing'"):
        make_notification(status="resolved")
    with pytest.raises(ValueError):
        make_alert(severity="P9")
    with pytest.raises(ValueError, match="alert status"):
        make_alert(status="pending")
    assert make_alert(severity="P2").severity.rank == 2


def test_value_is_shown_as_text_or_number() -> None:
    assert make_alert().shown_value == "p99 412 ms > 250 ms"
    assert make_alert(value_text="", value=0.25).shown_value == "0.25"
    assert make_alert(value_text="", value=None).shown_value == "n/a"
    assert make_alert(annotations={}).summary == "HighLatency"


def test_mixed_group_headline_counts_firing_alerts() -> None:
    from alerts.notifiers.render import headline

    resolved_p0 = make_alert(status="resolved", ends_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC))
    firing_p2 = make_alert(severity="P2", fingerprint="b")
    notification: Notification = make_notification(resolved_p0, firing_p2, replace(firing_p2, fingerprint="c"))
    assert headline(notification) == "[FIRING:2] P2 HighLatency"
