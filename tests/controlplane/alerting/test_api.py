"""The alerts API: list and timeline, acknowledge, silences with validated matchers, roles."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import select

from alerts.notifiers import NOTIFIERS
from alerts.states import AlertState
from controlplane.alerting import readmodel
from controlplane.auth import Role
from controlplane.models import AlertRecord, AuditEvent, Receiver
from tests.controlplane.conftest import token_for


def firing_alert(app) -> str:
    now = datetime.now(UTC)
    with app.extensions["flightdeck"].sessions() as s, s.begin():
        s.add(AlertRecord(fingerprint="abc123", rule="high_error_rate", severity="P0", labels={"model": "mlp"},
                          state="firing", value=0.2, summary="mlp errors", firing_since=now, updated_at=now))  # fmt: skip
    return "abc123"


def test_acknowledge_records_who_and_stops_being_anonymous(app, client, operator, viewer) -> None:
    fp = firing_alert(app)
    assert client.post(f"/api/alerts/{fp}/ack").status_code == 401
    assert client.post(f"/api/alerts/{fp}/ack", headers=viewer).status_code == 403
    acked = client.post(f"/api/alerts/{fp}/ack", headers=operator)
    assert acked.status_code == 200 and acked.get_json()["acknowledged_by"] == "otto"
    detail = client.get(f"/api/alerts/{fp}").get_json()
    assert [e["kind"] for e in detail["timeline"]] == ["acknowledged"]
    assert client.get("/api/alerts?state=firing").get_json()["alerts"][0]["fingerprint"] == fp
    assert client.get("/api/alerts?state=burning").status_code == 400
    assert client.post("/api/alerts/nope/ack", headers=operator).status_code == 404
    with app.extensions["flightdeck"].sessions() as s:
        assert "alert.ack" in [e.action for e in s.scalars(select(AuditEvent))]


def test_silences_are_validated_created_listed_and_expired(client, operator) -> None:
    good = {
        "matchers": [{"label": "model", "value": "text.*", "regex": True}],
        "comment": "deploy window",
        "duration": "2h",
    }
    cases = [
        ({**good, "matchers": []}, "'matchers' must be a non-empty list"),
        ({**good, "matchers": [{"label": "bad label", "value": "x"}]}, "is not a label name"),
        ({**good, "matchers": [{"label": "model", "value": "(", "regex": True}]}, "does not compile"),
        ({**good, "comment": " "}, "'comment' must say why"),
        ({**good, "duration": "forever"}, "duration must look like"),
        ({k: v for k, v in good.items() if k != "duration"}, "give 'duration'"),
    ]
    for body, message in cases:
        response = client.post("/api/silences", json=body, headers=operator)
        assert response.status_code == 400 and message in response.get_json()["error"]["message"], body
    created = client.post("/api/silences", json=good, headers=operator)
    assert created.status_code == 201 and created.get_json()["active"] and created.get_json()["author"] == "otto"
    silence_id = created.get_json()["id"]
    expired = client.delete(f"/api/silences/{silence_id}", headers=operator).get_json()
    assert expired["active"] is False and expired["expired_by"] == "otto"
    assert [s["id"] for s in client.get("/api/silences").get_json()["silences"]] == [silence_id]


def test_unknown_fields_are_refused_by_name(client, operator) -> None:
    good = {"matchers": [{"label": "model", "value": "mlp"}], "comment": "window", "duration": "1h"}
    for body, named in [
        ({**good, "durration": "2h"}, "'durration'"),
        ({**good, "matchers": [{"label": "model", "value": "mlp", "regexp": True}]}, "'matchers[0].regexp'"),
    ]:
        response = client.post("/api/silences", json=body, headers=operator)
        message = response.get_json()["error"]["message"]
        assert response.status_code == 400 and "unknown field" in message and named in message, message
    typed = client.post("/api/silences", json={**good, "starts_at": 5}, headers=operator)
    assert typed.status_code == 400 and "'starts_at' must be a string" in typed.get_json()["error"]["message"]
    assert client.get("/api/silences").get_json()["silences"] == []


def test_each_receiver_kind_takes_its_own_config_and_never_shows_a_secret(app, client) -> None:
    admin = token_for(app, "ada", Role.ADMIN)
    url = "https://open.feishu.cn/open-apis/bot/v2/hook/0123456789abcdef"

    def put(body: dict):
        return client.put("/api/receivers/chat", json=body, headers=admin)

    refusals = [
        ({"kind": "slack", "config": {"url": url, "secret": "s"}}, "receiver config: slack: unknown config keys"),
        ({"kind": "feishu", "config": {"url": url, "secret": ""}}, "'secret' must be a non-empty string"),
        ({"kind": "webhook", "config": {"url": url, "max_alerts": "5"}}, "'max_alerts' must be a whole number"),
        (
            {
                "kind": "webhook",
                "config": {"url": url, "bearer_token": "t", "basic_auth": {"username": "u", "password": "p"}},
            },
            "give bearer_token or basic_auth, not both",
        ),  # fmt: skip
        (
            {"kind": "webhook", "config": {"url": url, "basic_auth": {"username": "u", "password": "p", "x": 1}}},
            "'webhook.config.basic_auth.x'",
        ),  # fmt: skip
        ({"kind": "teams", "config": {"url": url, "allow_http": "yes"}}, "'teams.config.allow_http' must be true"),
        ({"kind": "slack", "config": {"url": url}, "severity": ["P0"]}, "unknown field(s) ['severity']"),
        ({"kind": "slack", "config": {"url": url}, "severities": ["P9"]}, "'severities' must list some of P0, P1, P2"),
        ({"kind": "slack", "config": {"url": url}, "enabled": "no"}, "'slack.enabled' must be true or false"),
        ({"kind": "slack", "config": "https://x"}, "'config' must be an object"),
    ]
    for body, message in refusals:
        response = put(body)
        assert response.status_code == 400 and message in response.get_json()["error"]["message"], response.get_json()
    assert client.get("/api/receivers", headers=admin).get_json()["receivers"] == []

    signed = put({"kind": "feishu", "config": {"url": url, "secret": "sign-me-0123456789"}, "severities": ["P0"]})
    assert signed.status_code == 200, signed.get_json()
    shown = signed.get_json()
    with app.extensions["flightdeck"].sessions() as s:
        keys = app.extensions["flightdeck"].receiver_keys  # the stored config is encrypted
        described = json.loads(json.dumps(readmodel.receiver_json(s.get(Receiver, "chat"), keys)))
    # Exactly what the read model (the notifier's describe()) says: no secret, no key added as null.
    assert shown == described and shown["signed"] is True and shown["url"] == "https://open.feishu.cn/***"
    assert "secret" not in shown and "auth" not in shown and shown["rate_limits"] == [[5, 1.0], [100, 60.0]]
    hook = put({"kind": "webhook", "config": {"url": url, "bearer_token": "tok-0123456789abcdef"}})
    assert hook.get_json()["auth"] == "bearer" and hook.get_json()["severities"] == ["P0", "P1", "P2"]
    listed = json.dumps(client.get("/api/receivers", headers=admin).get_json())
    assert "0123456789" not in listed and "sign-me" not in listed and "tok-" not in listed
    with app.extensions["flightdeck"].sessions() as s:
        stored = s.get(Receiver, "chat").config  # encrypted at rest; the keys give back exactly what was sent
        assert "tok-" not in json.dumps(stored)
        assert keys.open(stored) == {"url": url, "bearer_token": "tok-0123456789abcdef"}


def test_the_document_lists_every_notifier_kind_with_its_own_config(client) -> None:
    document = client.get("/api/openapi.json").get_json()
    body = document["paths"]["/api/receivers/{name}"]["put"]["requestBody"]["content"]["application/json"]["schema"]
    schemas = document["components"]["schemas"]
    receiver = schemas[body["$ref"].rsplit("/", 1)[1]]
    assert set(receiver["discriminator"]["mapping"]) == set(NOTIFIERS)
    feishu = schemas[receiver["discriminator"]["mapping"]["feishu"].rsplit("/", 1)[1]]
    config = schemas[feishu["properties"]["config"]["$ref"].rsplit("/", 1)[1]]
    assert {"url", "allow_http", "secret"} == set(config["properties"]) and config["additionalProperties"] is False
    states = document["components"]["schemas"]["AlertState"]["enum"]
    assert states == [s.value for s in AlertState]
