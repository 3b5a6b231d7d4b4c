"""The alerts API: alerts and their timeline, acknowledgement, silences."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.notifiers import make_notifier
from alerts.notifiers.base import Alert, Notification
from alerts.notifiers.delivery import deliver
from alerts.states import AlertState, Severity
from controlplane.auth import Role, current_actor, record_event, require_role
from controlplane.db import get_db
from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.history.api import parse_time
from controlplane.models import AlertEvent, AlertRecord, Receiver, SilenceRecord
from controlplane.scheduler import utcnow

bp = Blueprint("alerts", __name__, url_prefix="/api")

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")


def alert_json(row: AlertRecord) -> dict[str, Any]:
    def iso(value):
        return value.isoformat() if value else None

    return {
        "fingerprint": row.fingerprint, "rule": row.rule, "severity": row.severity, "state": row.state,
        "labels": row.labels, "value": row.value, "summary": row.summary, "pending_since": iso(row.pending_since),
        "firing_since": iso(row.firing_since), "resolved_at": iso(row.resolved_at),
        "last_notified_at": iso(row.last_notified_at), "acknowledged_by": row.acknowledged_by,
        "acknowledged_at": iso(row.acknowledged_at), "runbook_attempts": row.runbook_attempts,
    }  # fmt: skip


def silence_json(row: SilenceRecord) -> dict[str, Any]:
    return {
        "id": row.id, "matchers": row.matchers, "starts_at": row.starts_at.isoformat(), "ends_at": row.ends_at.isoformat(),
        "author": row.author, "comment": row.comment, "active": row.expired_by is None and row.ends_at > utcnow(),
        "expired_by": row.expired_by,
    }  # fmt: skip


def _audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
    record_event(session, current_actor(), action, target, outcome, detail)


@bp.get("/alerts")
def list_alerts() -> Response:
    """Alerts, most urgent first; ?state=firing|pending|resolved|inactive filters."""
    query = select(AlertRecord)
    state = request.args.get("state")
    if state is not None:
        if state not in {s.value for s in AlertState}:
            raise ApiError(f"'state' must be one of {[s.value for s in AlertState]}")
        query = query.where(AlertRecord.state == state)
    rows = sorted(get_db().scalars(query), key=lambda r: (r.state != "firing", r.severity, r.rule))
    return jsonify({"alerts": [alert_json(r) for r in rows]})


def alert_timeline(session: Session, fingerprint: str) -> list[dict[str, Any]]:
    """Return an alert's events, oldest first: state changes, notifications, suppressions, runbook runs, acks."""
    events = session.scalars(select(AlertEvent).where(AlertEvent.fingerprint == fingerprint).order_by(AlertEvent.id))
    return [
        {"ts": e.ts.isoformat(), "kind": e.kind, "state": e.state, "value": e.value, "detail": e.detail} for e in events
    ]


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
    row = session.get(AlertRecord, fingerprint)
    if row is None:
        raise NotFound(f"no alert {fingerprint}")
    if row.state != AlertState.FIRING.value:
        raise Conflict(f"only a firing alert can be acknowledged; this one is {row.state}")
    actor = current_actor()
    row.acknowledged_by, row.acknowledged_at = actor.name, utcnow()
    session.add(AlertEvent(fingerprint=fingerprint, ts=row.acknowledged_at, kind="acknowledged", state=row.state,
                           value=row.value, detail={"by": actor.name}))  # fmt: skip
    _audit(session, "alert.ack", fingerprint, "ok", {"rule": row.rule})
    session.commit()
    return jsonify(alert_json(row))


@bp.get("/silences")
def list_silences() -> Response:
    rows = get_db().scalars(select(SilenceRecord).order_by(SilenceRecord.id.desc()))
    return jsonify({"silences": [silence_json(r) for r in rows]})


def _matchers(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise ApiError("'matchers' must be a non-empty list of {label, value, regex?}")
    matchers = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("label"), str) or not isinstance(m.get("value"), str):
            raise ApiError("each matcher needs a string 'label' and a string 'value'")
        if not _LABEL.match(m["label"]):
            raise ApiError(f"matcher label {m['label']!r} is not a label name")
        regex = bool(m.get("regex", False))
        if regex:
            try:
                re.compile(m["value"])
            except re.error as exc:
                raise ApiError(f"matcher regex {m['value']!r} does not compile: {exc}") from None
        matchers.append({"label": m["label"], "value": m["value"], "regex": regex})
    return matchers


@bp.post("/silences")
@require_role(Role.OPERATOR, action="silence.create")
def create_silence() -> tuple[Response, int]:
    """Mute matching alerts' notifications: {matchers, comment, duration: '2h' | ends_at, starts_at?}."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    now = utcnow()
    comment = body.get("comment")
    if not isinstance(comment, str) or not comment.strip():
        raise ApiError("'comment' must say why (it is shown beside the silence)")
    starts = parse_time(body["starts_at"], "starts_at", now) if body.get("starts_at") else now
    if body.get("duration"):
        from alerts.rules import RuleError, parse_duration

        try:
            ends = starts + parse_duration(body["duration"], "'duration'")
        except RuleError as exc:
            raise ApiError(str(exc)) from None
    elif body.get("ends_at"):
        ends = parse_time(body["ends_at"], "ends_at", now)
    else:
        raise ApiError("give 'duration' (e.g. 2h) or 'ends_at'")
    if ends <= starts or ends - starts > timedelta(days=30):
        raise ApiError("a silence must end after it starts, and within 30 days")
    session = get_db()
    row = SilenceRecord(matchers=_matchers(body.get("matchers")), starts_at=starts, ends_at=ends,
                        author=current_actor().name, comment=comment.strip(), created_at=now)  # fmt: skip
    session.add(row)
    session.flush()
    _audit(session, "silence.create", str(row.id), "ok", {"matchers": row.matchers, "ends_at": ends.isoformat()})
    session.commit()
    return jsonify(silence_json(row)), 201


@bp.delete("/silences/<int:silence_id>")
@require_role(Role.OPERATOR, action="silence.expire")
def expire_silence(silence_id: int) -> Response:
    """End a silence now (it stays listed, marked expired)."""
    session = get_db()
    row = session.get(SilenceRecord, silence_id)
    if row is None:
        raise NotFound(f"no silence {silence_id}")
    row.expired_by = current_actor().name
    row.ends_at = min(row.ends_at, utcnow())
    _audit(session, "silence.expire", str(silence_id), "ok", {})
    session.commit()
    return jsonify(silence_json(row))


def receiver_json(row: Receiver) -> dict[str, Any]:
    """Describe a receiver without its secrets or its full URL."""
    try:
        shown = make_notifier(row.kind, row.config).describe()
    except ValueError as exc:
        shown = {"kind": row.kind, "error": str(exc)}
    return {"name": row.name, "severities": row.severities, "matchers": row.matchers, "enabled": row.enabled, **shown}


@bp.get("/receivers")
def list_receivers() -> Response:
    rows = get_db().scalars(select(Receiver).order_by(Receiver.name))
    return jsonify({"receivers": [receiver_json(r) for r in rows]})


@bp.put("/receivers/<name>")
@require_role(Role.ADMIN, action="receiver.put")
def put_receiver(name: str) -> Response:
    """Create or replace a receiver: {kind, config: {url, secret?...}, severities: [P0, P1], matchers?}."""
    if not _LABEL.match(name):
        raise ApiError("a receiver name is letters, digits and underscores")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    kind, config = body.get("kind"), body.get("config")
    if not isinstance(config, dict):
        raise ApiError("'config' must be an object (url and the service's secrets)")
    try:
        make_notifier(str(kind), config)
    except ValueError as exc:
        raise ApiError(f"receiver config: {exc}") from None
    severities = body.get("severities", ["P0", "P1", "P2"])
    if not isinstance(severities, list) or not severities or set(severities) - {"P0", "P1", "P2"}:
        raise ApiError("'severities' must list some of P0, P1, P2")
    session = get_db()
    row = session.get(Receiver, name) or Receiver(name=name, created_at=utcnow())
    row.kind, row.config, row.severities = kind, config, severities
    row.matchers = _matchers(body["matchers"]) if body.get("matchers") else []
    row.enabled = bool(body.get("enabled", True))
    session.add(row)
    _audit(session, "receiver.put", name, "ok", {"kind": kind, "severities": severities})  # never the config
    session.commit()
    return jsonify(receiver_json(row))


@bp.delete("/receivers/<name>")
@require_role(Role.ADMIN, action="receiver.delete")
def delete_receiver(name: str) -> tuple[str, int]:
    session = get_db()
    row = session.get(Receiver, name)
    if row is None:
        raise NotFound(f"no receiver {name!r}")
    session.delete(row)
    _audit(session, "receiver.delete", name, "ok", {})
    session.commit()
    return "", 204


@bp.post("/receivers/<name>/test")
@require_role(Role.OPERATOR, action="receiver.test")
def test_receiver(name: str) -> Response:
    """Send a test message now and say what the service answered."""
    session = get_db()
    row = session.get(Receiver, name)
    if row is None:
        raise NotFound(f"no receiver {name!r}")
    now = utcnow()
    notifier = make_notifier(row.kind, row.config)
    alert = Alert(fingerprint="test", name="flightdeck_test", severity=Severity.P2, status="firing", starts_at=now,
                  labels={"alertname": "flightdeck_test"}, annotations={"summary": f"Test message from Flightdeck to {name}"})  # fmt: skip
    result = deliver(notifier, Notification(receiver=name, group_key="{test}", status="firing", alerts=[alert]), now)
    _audit(session, "receiver.test", name, "ok" if result.ok else "error", {"error": result.error})
    session.commit()
    return jsonify({"ok": result.ok, "error": result.error, "retry_after_s": result.retry_after_s})
