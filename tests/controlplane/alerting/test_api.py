"""The alerts API: list and timeline, acknowledge, silences with validated matchers, roles."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from controlplane.models import AlertRecord, AuditEvent


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
