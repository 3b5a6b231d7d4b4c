"""Generic webhook: byte-for-byte Alertmanager's version-4 body, its formats, auth, and the wire."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from alerts.notifiers import deliver, make_notifier
from alerts.notifiers.goformat import go_json, go_string, go_time, label_fingerprint, quote_meta
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW, make_alert, make_notification, many_alerts, resolved_alert

URL = "https://hooks.example/alertmanager"

TOP_KEYS = [
    "receiver",
    "status",
    "alerts",
    "groupLabels",
    "commonLabels",
    "commonAnnotations",
    "externalURL",
    "version",
    "groupKey",
    "truncatedAlerts",
]
ALERT_KEYS = ["status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"]

# What Alertmanager's Go encoder writes for `two_alerts()` (hand-written, not generated): struct
# fields in order, map keys sorted, no spaces, <>& escaped, RFC 3339 times, trailing newline.
GOLDEN = (
    rb'{"receiver":"team-x\\.ops","status":"firing","alerts":['
    rb'{"status":"firing","labels":{"alertname":"HighLatency","model":"textcls","severity":"P0"},'
    rb'"annotations":{"description":"p99 over 5 minutes","runbook_command":"python runbooks/rollback.py --model textcls",'
    rb'"runbook_url":"https://runbooks.example/latency","summary":"textcls p99 latency above 250 ms",'
    rb'"value":"p99 412 ms \u003e 250 ms"},"startsAt":"2024-05-01T12:00:05.12Z","endsAt":"0001-01-01T00:00:00Z",'
    rb'"generatorURL":"https://flightdeck.example/alerts/3f2a9c1b7d6e5a40","fingerprint":"3f2a9c1b7d6e5a40"},'
    rb'{"status":"resolved","labels":{"alertname":"HighLatency","model":"mlp","severity":"P1"},'
    rb'"annotations":{"runbook_url":"https://runbooks.example/latency","summary":"mlp errors \u003c 1% \u0026 falling",'
    rb'"value":"0.004"},"startsAt":"2024-05-01T20:00:00+08:00","endsAt":"2024-05-01T12:30:00Z",'
    rb'"generatorURL":"https://flightdeck.example/alerts/00000000000000aa","fingerprint":"00000000000000aa"}],'
    rb'"groupLabels":{"alertname":"HighLatency"},"commonLabels":{"alertname":"HighLatency"},'
    rb'"commonAnnotations":{"runbook_url":"https://runbooks.example/latency"},"externalURL":"https://flightdeck.example",'
    rb'"version":"4","groupKey":"{}:{alertname=\"HighLatency\"}","truncatedAlerts":0}'
    b"\n"
)


def two_alerts():
    mlp = resolved_alert(
        fingerprint="00000000000000aa",
        severity="P1",
        labels={"alertname": "HighLatency", "model": "mlp", "severity": "P1"},
        annotations={"summary": "mlp errors < 1% & falling"},
        value=0.004,
        value_text="",
        runbook_command="",
        starts_at=datetime(2024, 5, 1, 20, 0, tzinfo=timezone(timedelta(hours=8))),
        console_url="https://flightdeck.example/alerts/00000000000000aa",
    )
    return make_notification(make_alert(), mlp, receiver="team-x.ops")


def ordered_json(body: bytes) -> list:
    return json.loads(body, object_pairs_hook=lambda pairs: pairs)


def test_body_is_byte_for_byte_what_alertmanager_sends() -> None:
    body = make_notifier("webhook", {"url": URL}).build(two_alerts(), NOW).body
    assert body == GOLDEN


def test_exact_keys_in_alertmanagers_order() -> None:
    pairs = ordered_json(make_notifier("webhook", {"url": URL}).build(two_alerts(), NOW).body)
    assert [k for k, _ in pairs] == TOP_KEYS
    document = dict(pairs)
    assert document["version"] == "4" and document["truncatedAlerts"] == 0
    for alert in document["alerts"]:
        assert [k for k, _ in alert] == ALERT_KEYS


def test_firing_alerts_have_the_zero_end_and_resolved_ones_a_real_one(resolved) -> None:
    body = json.loads(make_notifier("webhook", {"url": URL}).build(resolved, NOW).body)
    assert body["status"] == "resolved"
    [alert] = body["alerts"]
    assert (alert["startsAt"], alert["endsAt"]) == ("2024-05-01T12:00:05.12Z", "2024-05-01T12:30:00Z")
    firing = json.loads(make_notifier("webhook", {"url": URL}).build(make_notification(), NOW).body)
    assert firing["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"


def test_max_alerts_truncates_and_counts_like_alertmanager() -> None:
    notification = make_notification(*many_alerts(5))
    body = json.loads(make_notifier("webhook", {"url": URL, "max_alerts": 2}).build(notification, NOW).body)
    assert len(body["alerts"]) == 2 and body["truncatedAlerts"] == 3
    assert body["commonLabels"] == {"alertname": "HighLatency", "severity": "P1"}


def test_missing_fingerprint_is_prometheus_label_fingerprint() -> None:
    alert = make_alert(fingerprint="")
    [sent] = json.loads(make_notifier("webhook", {"url": URL}).build(make_notification(alert), NOW).body)["alerts"]
    assert sent["fingerprint"] == label_fingerprint(sent["labels"])


def test_go_string_escapes_like_encoding_json() -> None:
    assert go_string('a"b\\c') == r'"a\"b\\c"'
    assert go_string("<b>&</b>") == r'"\u003cb\u003e\u0026\u003c/b\u003e"'
    assert go_string("\n\r\t\b\f\x01\x1f") == r'"\n\r\t\b\f\u0001\u001f"'
    assert go_string("\u2028\u2029") == r'"\u2028\u2029"'
    assert go_string("ünï 延迟 \x7f") == '"ünï 延迟 \x7f"'  # UTF-8 as is, DEL unescaped
    assert go_string("\ud800") == r'"\ufffd"'
    assert go_json({"b": 1, "a": [True, None]}) == '{"a":[true,null],"b":1}'


def test_go_time_matches_rfc3339_nano() -> None:
    assert go_time(None) == "0001-01-01T00:00:00Z"
    assert go_time(datetime(2024, 5, 1, 12, 0, 5, 100000, tzinfo=UTC)) == "2024-05-01T12:00:05.1Z"
    assert go_time(datetime(2024, 5, 1, 12, 0, 5, 123456, tzinfo=UTC)) == "2024-05-01T12:00:05.123456Z"
    assert go_time(datetime(2024, 5, 1, 12, 0, 5)) == "2024-05-01T12:00:05Z"
    assert (
        go_time(datetime(2024, 5, 1, 7, 0, tzinfo=timezone(-timedelta(hours=5, minutes=30))))
        == "2024-05-01T07:00:00-05:30"
    )


def test_quote_meta_and_fingerprint_follow_go() -> None:
    assert quote_meta(r"a.b+c*d?e(f)g|h[i]j{k}l^m$n\o-p") == r"a\.b\+c\*d\?e\(f\)g\|h\[i\]j\{k\}l\^m\$n\\o-p"
    assert label_fingerprint({}) == "cbf29ce484222325"  # FNV-1a 64 offset basis: Prometheus' empty signature
    digest = 0xCBF29CE484222325
    for byte in b"alertname\xffTest\xff":
        digest = ((digest ^ byte) * 0x100000001B3) % 2**64
    assert label_fingerprint({"alertname": "Test"}) == f"{digest:016x}"


def test_auth_headers_and_describe_without_secrets() -> None:
    bearer = make_notifier("webhook", {"url": URL, "bearer_token": "tok-123456-secret"})
    assert bearer.build(make_notification(), NOW).headers["Authorization"] == "Bearer tok-123456-secret"
    assert "tok-123456-secret" not in json.dumps(bearer.describe()) and bearer.describe()["auth"] == "bearer"
    basic = make_notifier("webhook", {"url": URL, "basic_auth": {"username": "am", "password": "pa55word"}})
    credentials = base64.b64encode(b"am:pa55word").decode()
    assert basic.build(make_notification(), NOW).headers["Authorization"] == f"Basic {credentials}"
    assert "pa55word" not in repr(basic) and credentials not in repr(basic)
    with pytest.raises(ValueError, match="not both"):
        make_notifier("webhook", {"url": URL, "bearer_token": "t", "basic_auth": {"username": "u", "password": "p"}})
    with pytest.raises(ValueError, match="max_alerts"):
        make_notifier("webhook", {"url": URL, "max_alerts": -1})


def test_delivers_the_exact_bytes_over_http() -> None:
    with RecordingServer(200, b"") as server:
        config = {"url": server.url + "/am", "allow_http": True, "bearer_token": "tok-123456-secret"}
        assert deliver(make_notifier("webhook", config), two_alerts(), NOW, timeout_s=5, targets=LOOPBACK).ok
    [request] = server.requests
    assert request.body == GOLDEN
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer tok-123456-secret"


def test_the_message_key_travels_in_an_idempotency_key_header_and_the_body_stays_alertmanagers() -> None:
    notifier = make_notifier("webhook", {"url": URL})
    keyed = make_notification(key="5f0c8e1d2b3a4c5d6e7f8091a2b3c4d5")
    first, again, unkeyed = (
        notifier.build(keyed, NOW),
        notifier.build(keyed, NOW),
        notifier.build(make_notification(), NOW),
    )
    assert first.headers["Idempotency-Key"] == again.headers["Idempotency-Key"] == "5f0c8e1d2b3a4c5d6e7f8091a2b3c4d5"
    assert "Idempotency-Key" not in unkeyed.headers
    assert first.body == unkeyed.body  # nothing in the body Alertmanager would not send
