"""What people do to alerts: acknowledge one, silence or unsilence matching alerts, manage chat receivers.

Each function takes the session, who acts (a name) and an `Audit` callback, writes the change and
its audit event in that session, and leaves the commit to the caller, so the JSON API (which the
console's forms call) and any CLI share one write path. Values come parsed (`matchers_from` checks
matchers as sent); the domain rules (a firing alert only, a silence within 30 days, a receiver
config its notifier accepts) are checked here.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from alerts.dispatch import REPEAT_INTERVAL
from alerts.lifecycle import Tracked
from alerts.notifiers import make_notifier
from alerts.notifiers.base import Alert, Notification
from alerts.notifiers.delivery import DeliveryResult, deliver
from alerts.notifiers.goformat import label_fingerprint
from alerts.notifiers.targets import PUBLIC_ONLY, TargetPolicy, TargetRefused
from alerts.states import AlertState, Severity
from controlplane.alerting.notify import receiver_route
from controlplane.alerting.secretbox import Keyring, open_config
from controlplane.auth.audit import Audit
from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.models import AlertEvent, AlertRecord, Receiver, SilenceRecord

MAX_SILENCE = timedelta(days=30)


@dataclass(frozen=True)
class RouteSettings:
    """A receiver's grouping and pacing as people set it (seconds; None: the default)."""

    group_by: tuple[str, ...] | None = None
    group_wait_s: float | None = None
    group_interval_s: float | None = None
    repeat_interval_s: float | None = None


SEVERITIES = tuple(s.value for s in Severity)
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")  # a label name; receiver names follow it too


def acknowledge(session: Session, fingerprint: str, by: str, audit: Audit, now: datetime) -> AlertRecord:
    """Mark a firing alert as acknowledged by `by` (so it is not repeated), with a timeline event."""
    row = session.get(AlertRecord, fingerprint)
    if row is None:
        raise NotFound(f"no alert {fingerprint}")
    if row.state != AlertState.FIRING.value:
        raise Conflict(f"only a firing alert can be acknowledged; this one is {row.state}")
    row.acknowledged_by, row.acknowledged_at = by, now
    session.add(AlertEvent(fingerprint=fingerprint, ts=now, kind="acknowledged", state=row.state, value=row.value,
                           detail={"by": by}))  # fmt: skip
    audit(session, "alert.ack", fingerprint, "ok", {"rule": row.rule})
    return row


def matchers_from(raw: Any) -> list[dict[str, Any]]:
    """Check matchers as sent ([{label, value, regex?}]) and return them as stored; a regex must compile."""
    if not isinstance(raw, list) or not raw:
        raise ApiError("'matchers' must be a non-empty list of {label, value, regex?}")
    matchers = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("label"), str) or not isinstance(m.get("value"), str):
            raise ApiError("each matcher needs a string 'label' and a string 'value'")
        if not LABEL.match(m["label"]):
            raise ApiError(f"matcher label {m['label']!r} is not a label name")
        regex = bool(m.get("regex", False))
        if regex:
            try:
                re.compile(m["value"])
            except re.error as exc:
                raise ApiError(f"matcher regex {m['value']!r} does not compile: {exc}") from None
        matchers.append({"label": m["label"], "value": m["value"], "regex": regex})
    return matchers


def create_silence(
    session: Session,
    matchers: list[dict[str, Any]],
    starts: datetime,
    ends: datetime,
    comment: str,
    author: str,
    audit: Audit,
    now: datetime,
) -> SilenceRecord:
    """Mute the notifications of alerts matching `matchers` (from `matchers_from`) from `starts` to `ends`."""
    if ends <= starts or ends - starts > MAX_SILENCE:
        raise ApiError("a silence must end after it starts, and within 30 days")
    row = SilenceRecord(matchers=matchers, starts_at=starts, ends_at=ends, author=author,
                        comment=comment, created_at=now)  # fmt: skip
    session.add(row)
    session.flush()  # the id names the silence in its audit event
    audit(session, "silence.create", str(row.id), "ok", {"matchers": row.matchers, "ends_at": ends.isoformat()})
    return row


def expire_silence(session: Session, silence_id: int, by: str, audit: Audit, now: datetime) -> SilenceRecord:
    """End a silence now; it stays listed, marked expired by `by`."""
    row = session.get(SilenceRecord, silence_id)
    if row is None:
        raise NotFound(f"no silence {silence_id}")
    row.expired_by = by
    row.ends_at = min(row.ends_at, now)
    audit(session, "silence.expire", str(silence_id), "ok", {})
    return row


def put_receiver(
    session: Session,
    name: str,
    kind: str,
    config: dict[str, Any],
    severities: list[str],
    matchers: list[dict[str, Any]],
    enabled: bool,
    audit: Audit,
    now: datetime,
    route: RouteSettings | None = None,
    targets: TargetPolicy = PUBLIC_ONLY,
    *,
    keys: Keyring,
) -> Receiver:
    """Create or replace a chat receiver once its notifier accepts `config`; stored encrypted with `keys`, never audited.

    `route` sets its grouping and pacing (Alertmanager's group_by, group_wait, group_interval,
    repeat_interval); a value left None takes the default. `targets` refuses an internal
    destination the allow-list does not name (the names are checked again, resolved, at each send).
    """
    try:
        notifier = make_notifier(kind, config)
        targets.check_url(notifier.url)
    except TargetRefused as exc:
        raise ApiError(f"receiver config: refused destination: {exc}") from None
    except ValueError as exc:
        raise ApiError(f"receiver config: {exc}") from None
    if not severities or set(severities) - set(SEVERITIES):
        raise ApiError("'severities' must list some of P0, P1, P2")
    route = route or RouteSettings()
    if route.group_by is not None and not all(LABEL.match(name) for name in route.group_by):
        raise ApiError("'group_by' must list label names")
    if any(v is not None and v < 0 for v in (route.group_wait_s, route.group_interval_s, route.repeat_interval_s)):
        raise ApiError("route durations cannot be negative")
    if route.group_interval_s == 0 or route.repeat_interval_s == 0:
        raise ApiError("'group_interval' and 'repeat_interval' must be longer than 0s")
    row = session.get(Receiver, name) or Receiver(name=name, created_at=now)
    row.kind, row.config, row.severities = kind, keys.seal(config), severities
    row.matchers = matchers
    row.enabled = enabled
    row.group_by = None if route.group_by is None else list(route.group_by)
    row.group_wait_s, row.group_interval_s = route.group_wait_s, route.group_interval_s
    row.repeat_interval_s = route.repeat_interval_s
    session.add(row)
    audit(session, "receiver.put", name, "ok", {"kind": kind, "severities": severities})
    return row


def _receiver(session: Session, name: str) -> Receiver:
    row = session.get(Receiver, name)
    if row is None:
        raise NotFound(f"no receiver {name!r}")
    return row


def delete_receiver(session: Session, name: str, audit: Audit) -> None:
    """Delete a receiver; notifications already queued for it are not sent."""
    session.delete(_receiver(session, name))
    audit(session, "receiver.delete", name, "ok", {})


def send_test_message(
    session: Session,
    name: str,
    audit: Audit,
    now: datetime,
    console_url: str = "http://127.0.0.1:8000",
    targets: TargetPolicy = PUBLIC_ONLY,
    keys: Keyring | None = None,
) -> DeliveryResult:
    """Send a test message through a receiver now and return what the service answered (status and code, no body).

    It is a real notification of the receiver's own route, so any consumer takes it: a P2 firing
    alert with a Prometheus label fingerprint, the console as `externalURL` and `generatorURL`,
    and a group key built like every other.
    """
    row = _receiver(session, name)
    try:
        notifier = make_notifier(row.kind, open_config(row.config, keys))
    except ValueError as exc:  # the key that sealed it is gone, or the config no longer validates
        raise ApiError(f"receiver config: {exc}") from None
    labels = {"alertname": "flightdeck_test", "severity": Severity.P2.value}
    fingerprint = label_fingerprint(labels)
    tracked = Tracked(fingerprint, "flightdeck_test", Severity.P2, labels, AlertState.FIRING, firing_since=now)
    route = receiver_route(row, REPEAT_INTERVAL)
    annotations = {"summary": f"Test message from Flightdeck to {name}", "description": "Nothing is wrong."}
    alert = Alert(fingerprint=fingerprint, name="flightdeck_test", severity=Severity.P2, status="firing",
                  starts_at=now, labels=labels, annotations=annotations, console_url=f"{console_url}/alerts")  # fmt: skip
    group_labels = route.group_labels(tracked)
    notification = Notification(
        receiver=name, group_key=route.group_key(tracked), status="firing", alerts=[alert], group_labels=group_labels,
        common_labels=labels, common_annotations=annotations, external_url=console_url, key=uuid.uuid4().hex,
    )  # fmt: skip
    result = deliver(notifier, notification, now, targets=targets)
    audit(session, "receiver.test", name, "ok" if result.ok else "error", {"error": result.error})
    return result
