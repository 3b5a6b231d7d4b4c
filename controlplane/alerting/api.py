"""The alerts API: alerts and their timeline, acknowledgement, silences, chat receivers.

Views parse the request, call `alerting.service` (writes) or `alerting.readmodel` (reads), commit
and answer; the console reads through the same read model.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from alerts.rules import RuleError, parse_duration
from alerts.states import AlertState
from controlplane.alerting import readmodel, service
from controlplane.alerting.readmodel import alert_json, alert_timeline, receiver_json, silence_json
from controlplane.auth import Role, current_actor, request_audit, require_role
from controlplane.db import get_db
from controlplane.errors import ApiError, NotFound
from controlplane.models import AlertRecord
from controlplane.scheduler import utcnow
from controlplane.timeparse import parse_time

bp = Blueprint("alerts", __name__, url_prefix="/api")


def _actor_name() -> str:
    actor = current_actor()
    assert actor is not None  # require_role let the request through
    return actor.name


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


@bp.get("/alerts")
def list_alerts() -> Response:
    """Alerts, most urgent first; ?state=firing|pending|resolved|inactive filters."""
    state = request.args.get("state")
    if state is not None and state not in {s.value for s in AlertState}:
        raise ApiError(f"'state' must be one of {[s.value for s in AlertState]}")
    rows = readmodel.list_alerts(get_db(), AlertState(state) if state is not None else None)
    return jsonify({"alerts": [alert_json(r) for r in rows]})


@bp.get("/alerts/<fingerprint>")
def show_alert(fingerprint: str) -> Response:
    """One alert with its timeline: state changes, notifications, suppressions, runbook runs, acks."""
    session = get_db()
    row = session.get(AlertRecord, fingerprint)
    if row is None:
        raise NotFound(f"no alert {fingerprint}")
    return jsonify({**alert_json(row), "timeline": alert_timeline(session, fingerprint)})


@bp.post("/alerts/<fingerprint>/ack")
@require_role(Role.OPERATOR, action="alert.ack")
def acknowledge(fingerprint: str) -> Response:
    """Acknowledge a firing alert: someone is on it, so it is not repeated."""
    session = get_db()
    row = service.acknowledge(session, fingerprint, _actor_name(), request_audit, utcnow())
    session.commit()
    return jsonify(alert_json(row))


@bp.get("/silences")
def list_silences() -> Response:
    """Every silence, newest first (expired ones stay listed)."""
    return jsonify({"silences": [silence_json(r) for r in readmodel.list_silences(get_db())]})


@bp.post("/silences")
@require_role(Role.OPERATOR, action="silence.create")
def create_silence() -> tuple[Response, int]:
    """Mute matching alerts' notifications: {matchers, comment, duration: '2h' | ends_at, starts_at?}."""
    body = _body()
    now = utcnow()
    comment = body.get("comment")
    if not isinstance(comment, str) or not comment.strip():
        raise ApiError("'comment' must say why (it is shown beside the silence)")
    starts = parse_time(body["starts_at"], "starts_at", now) if body.get("starts_at") else now
    if body.get("duration"):
        try:
            ends = starts + parse_duration(body["duration"], "'duration'")
        except RuleError as exc:
            raise ApiError(str(exc)) from None
    elif body.get("ends_at"):
        ends = parse_time(body["ends_at"], "ends_at", now)
    else:
        raise ApiError("give 'duration' (e.g. 2h) or 'ends_at'")
    matchers = service.matchers_from(body.get("matchers"))
    session = get_db()
    row = service.create_silence(session, matchers, starts, ends, comment.strip(), _actor_name(), request_audit, now)
    session.commit()
    return jsonify(silence_json(row)), 201


@bp.delete("/silences/<int:silence_id>")
@require_role(Role.OPERATOR, action="silence.expire")
def expire_silence(silence_id: int) -> Response:
    """End a silence now (it stays listed, marked expired)."""
    session = get_db()
    row = service.expire_silence(session, silence_id, _actor_name(), request_audit, utcnow())
    session.commit()
    return jsonify(silence_json(row))


@bp.get("/receivers")
def list_receivers() -> Response:
    """Every chat receiver, without its secrets."""
    return jsonify({"receivers": [receiver_json(r) for r in readmodel.list_receivers(get_db())]})


@bp.put("/receivers/<name>")
@require_role(Role.ADMIN, action="receiver.put")
def put_receiver(name: str) -> Response:
    """Create or replace a receiver: {kind, config: {url, secret?...}, severities: [P0, P1], matchers?}."""
    if not service.LABEL.match(name):
        raise ApiError("a receiver name is letters, digits and underscores")
    body = _body()
    config = body.get("config")
    if not isinstance(config, dict):
        raise ApiError("'config' must be an object (url and the service's secrets)")
    severities = body.get("severities", list(service.SEVERITIES))
    if not isinstance(severities, list):
        raise ApiError("'severities' must list some of P0, P1, P2")
    matchers = service.matchers_from(body["matchers"]) if body.get("matchers") else []
    session = get_db()
    row = service.put_receiver(
        session, name, str(body.get("kind")), config, severities, matchers, bool(body.get("enabled", True)),
        request_audit, utcnow(),
    )  # fmt: skip
    session.commit()
    return jsonify(receiver_json(row))


@bp.delete("/receivers/<name>")
@require_role(Role.ADMIN, action="receiver.delete")
def delete_receiver(name: str) -> tuple[str, int]:
    """Delete a receiver."""
    session = get_db()
    service.delete_receiver(session, name, request_audit)
    session.commit()
    return "", 204


@bp.post("/receivers/<name>/test")
@require_role(Role.OPERATOR, action="receiver.test")
def test_receiver(name: str) -> Response:
    """Send a test message now and say what the service answered."""
    session = get_db()
    result = service.send_test_message(session, name, request_audit, utcnow())
    session.commit()
    return jsonify({"ok": result.ok, "error": result.error, "retry_after_s": result.retry_after_s})
