"""The alerts API: alerts and their timeline, acknowledgement, silences, chat receivers.

Views take their bodies and queries parsed (`alerting.schemas`), call `alerting.service` (writes)
or `alerting.readmodel` (reads), commit and answer; the console reads through the same read model.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from alerts.rules import parse_duration
from controlplane.alerting import readmodel, service
from controlplane.alerting.readmodel import alert_json, alert_timeline, receiver_json, silence_json
from controlplane.alerting.schemas import (
    AlertDetail,
    AlertList,
    AlertQuery,
    AlertView,
    NotificationList,
    NotificationQuery,
    ReceiverList,
    ReceiverPut,
    ReceiverView,
    SilenceCreate,
    SilenceList,
    SilenceView,
    TestResult,
)
from controlplane.auth import Role
from controlplane.auth.guard import current_actor, request_audit, require_role
from controlplane.clock import utcnow
from controlplane.context import current_services, get_db
from controlplane.contract import operation
from controlplane.errors import ApiError, NotFound
from controlplane.models import AlertRecord
from controlplane.timeparse import parse_time

bp = Blueprint("alerts", __name__, url_prefix="/api")

FINGERPRINT = {"fingerprint": "the alert's fingerprint (its rule and label set)"}
RECEIVER = {"name": "the receiver's name: letters, digits and underscores"}


def _actor_name() -> str:
    actor = current_actor()
    assert actor is not None  # require_role let the request through
    return actor.name


@bp.get("/alerts")
@operation(query=AlertQuery, response=AlertList)
def list_alerts(query: AlertQuery) -> dict[str, Any]:
    """List alerts, most urgent first; ?state= filters."""
    return {"alerts": [alert_json(r) for r in readmodel.list_alerts(get_db(), query.state)]}


@bp.get("/alerts/<fingerprint>")
@operation(response=AlertDetail, errors={404: "No such alert"}, path=FINGERPRINT)
def show_alert(fingerprint: str) -> dict[str, Any]:
    """Show one alert with its timeline: state changes, notifications, suppressions, runbook runs, acks."""
    session = get_db()
    row = session.get(AlertRecord, fingerprint)
    if row is None:
        raise NotFound(f"no alert {fingerprint}")
    return {**alert_json(row), "timeline": alert_timeline(session, fingerprint)}


@bp.post("/alerts/<fingerprint>/ack")
@require_role(Role.OPERATOR, action="alert.ack")
@operation(response=AlertView, errors={404: "No such alert", 409: "The alert is not firing"}, path=FINGERPRINT)
def acknowledge(fingerprint: str) -> dict[str, Any]:
    """Acknowledge a firing alert: someone is on it, so it is not repeated."""
    session = get_db()
    row = service.acknowledge(session, fingerprint, _actor_name(), request_audit, utcnow())
    session.commit()
    return alert_json(row)


@bp.get("/silences")
@operation(response=SilenceList)
def list_silences() -> dict[str, Any]:
    """List every silence, newest first (expired ones stay listed)."""
    return {"silences": [silence_json(r) for r in readmodel.list_silences(get_db())]}


@bp.post("/silences")
@require_role(Role.OPERATOR, action="silence.create")
@operation(body=SilenceCreate, response=SilenceView, status=201)
def create_silence(body: SilenceCreate) -> tuple[dict[str, Any], int]:
    """Mute matching alerts' notifications for a duration (or until ends_at), at most 30 days."""
    now = utcnow()
    starts = parse_time(body.starts_at, "starts_at", now) if body.starts_at else now
    if body.duration:
        ends = starts + parse_duration(body.duration, "'duration'")  # checked by the model
    else:
        ends = parse_time(body.ends_at or "", "ends_at", now)
    matchers = [m.model_dump() for m in body.matchers]
    session = get_db()
    row = service.create_silence(session, matchers, starts, ends, body.comment, _actor_name(), request_audit, now)
    session.commit()
    return silence_json(row), 201


@bp.delete("/silences/<int:silence_id>")
@require_role(Role.OPERATOR, action="silence.expire")
@operation(response=SilenceView, errors={404: "No such silence"})
def expire_silence(silence_id: int) -> dict[str, Any]:
    """End a silence now (it stays listed, marked expired)."""
    session = get_db()
    row = service.expire_silence(session, silence_id, _actor_name(), request_audit, utcnow())
    session.commit()
    return silence_json(row)


@bp.get("/receivers")
@operation(response=ReceiverList)
def list_receivers() -> dict[str, Any]:
    """List every chat receiver, without its secrets."""
    keys = current_services().receiver_keys
    return {"receivers": [receiver_json(r, keys) for r in readmodel.list_receivers(get_db())]}


@bp.put("/receivers/<name>")
@require_role(Role.ADMIN, action="receiver.put")
@operation(body=ReceiverPut, response=ReceiverView, path=RECEIVER)
def put_receiver(name: str, body: ReceiverPut) -> dict[str, Any]:
    """Create or replace a chat receiver; its secrets are stored, never shown back."""
    if not service.LABEL.match(name):
        raise ApiError("a receiver name is letters, digits and underscores")
    receiver = body.root
    session, services = get_db(), current_services()
    row = service.put_receiver(
        session, name, receiver.kind, receiver.config.model_dump(exclude_unset=True),
        [s.value for s in receiver.severities], [m.model_dump() for m in receiver.matchers], receiver.enabled,
        request_audit, utcnow(), route=receiver.route(), targets=services.settings.receiver_targets,
        keys=services.receiver_keys,
    )  # fmt: skip
    session.commit()
    return receiver_json(row, services.receiver_keys)


@bp.delete("/receivers/<name>")
@require_role(Role.ADMIN, action="receiver.delete")
@operation(status=204, errors={404: "No such receiver"}, path=RECEIVER)
def delete_receiver(name: str) -> tuple[str, int]:
    """Delete a receiver."""
    session = get_db()
    service.delete_receiver(session, name, request_audit)
    session.commit()
    return "", 204


@bp.post("/receivers/<name>/test")
@require_role(Role.OPERATOR, action="receiver.test")
@operation(response=TestResult, errors={404: "No such receiver"}, path=RECEIVER)
def test_receiver(name: str) -> dict[str, Any]:
    """Send a test message now and say what the service answered."""
    session, services = get_db(), current_services()
    settings = services.settings
    result = service.send_test_message(
        session, name, request_audit, utcnow(), console_url=settings.console_url, targets=settings.receiver_targets,
        keys=services.receiver_keys,
    )  # fmt: skip
    session.commit()
    return {"ok": result.ok, "error": result.error, "retry_after_s": result.retry_after_s}


@bp.get("/notifications")
@operation(query=NotificationQuery, response=NotificationList)
def list_notifications(query: NotificationQuery) -> dict[str, Any]:
    """List the notification outbox, newest first: state, attempts, next try, last error."""
    rows = readmodel.list_notifications(get_db(), query.state, query.receiver, query.limit)
    return {"notifications": [readmodel.notification_json(r) for r in rows]}
