"""The audit trail: one event per mutating action (who, when, what, from where, how it ended).

`record_event` only adds the event to the caller's session, so a change and its event commit
together; `audited` wraps a change so that a failure still leaves an 'error' (or 'denied') event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from controlplane.auth.errors import AuthError
from controlplane.auth.roles import Actor
from controlplane.errors import ApiError
from controlplane.models import AuditEvent
from controlplane.requestscope import current_request

log = logging.getLogger(__name__)

AuditOutcome = Literal["ok", "denied", "error"]
MAX_LIMIT = 1000
ANONYMOUS = "anonymous"
_SECRET_KEYS = {"password", "secret", "token", "authorization", "password_hash", "token_hash"}

Audit = Callable[[Session, str, str, str, dict[str, Any]], None]
"""What services take to record their events: (session, action, target, outcome, detail); who is bound by the caller."""


def _scrub(detail: dict[str, Any]) -> dict[str, Any]:
    # NOTE: a last line of defence; callers are expected never to pass secrets in the first place.
    return {k: "[redacted]" if k.lower() in _SECRET_KEYS else v for k, v in detail.items()}


def record_event(
    session: Session,
    actor: Actor | None,
    action: str,
    target: str,
    outcome: AuditOutcome,
    detail: dict[str, Any] | None = None,
    *,
    now: datetime | None = None,
) -> AuditEvent:
    """Add an audit event to `session` without committing; address and request id come from the request, if any.

    Example: `record_event(db, current_actor(), "deploy.start", "textcls/2", "ok", {"weights": [90, 10]})`.
    The address is the connection's peer only (`requestscope`): no forwarding header is trusted.
    """
    body = _scrub(dict(detail or {}))
    if actor is not None and actor.token_id is not None:
        body.setdefault("token_id", actor.token_id)
    scope = current_request()
    event = AuditEvent(
        ts=now or datetime.now(UTC),
        actor=(actor.name if actor else ANONYMOUS)[:128],
        actor_kind=actor.kind if actor else "user",
        action=action[:64],
        target=target[:256],
        outcome=outcome,
        detail=body,
        address=scope.address if scope else None,
        request_id=scope.request_id if scope else None,
    )
    session.add(event)
    return event


def audit_as(actor: Actor | None) -> Audit:
    """Return an `Audit` that records events as `actor` (the CLI's OS user, the system), not the request's.

    Example: `deployments.undeploy(session, "mlp", audit_as(cli_actor()))`; views use `guard.request_audit`.
    """

    def audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
        record_event(session, actor, action, target, outcome, detail)

    return audit


@dataclass
class Pending:
    """What an `audited` block will record; the block may fill in the target and detail as it learns them."""

    target: str
    detail: dict[str, Any] = field(default_factory=dict)


@contextmanager
def audited(session: Session, actor: Actor | None, action: str, target: str = "") -> Iterator[Pending]:
    """Run a change, then commit it with an 'ok' event; on failure roll back and commit a 'denied'/'error' event.

    Example:
        with audited(db, actor, "user.create", name) as event:
            user = create_user(db, name, password, role, now)
            event.detail["role"] = role
    """
    pending = Pending(target)
    try:
        yield pending
        record_event(session, actor, action, pending.target, "ok", pending.detail)
        session.commit()
    except Exception as exc:
        session.rollback()
        outcome: AuditOutcome = "denied" if isinstance(exc, AuthError) else "error"
        message = exc.message if isinstance(exc, ApiError) else "internal error"
        try:
            record_event(session, actor, action, pending.target, outcome, {**pending.detail, "error": message})
            session.commit()
        except SQLAlchemyError:
            session.rollback()
            log.exception("could not record the audit event for a failed %s", action)
        raise


@contextmanager
def refusals_recorded(session: Session, actor: Actor | None, action: str, target: str) -> Iterator[None]:
    """Let a refused change leave a 'denied' (access) or 'error' (anything else) event in its own transaction.

    For services that write their own 'ok' event beside the change; `audited` is for those that do not.
    """
    try:
        yield
    except ApiError as exc:
        session.rollback()
        outcome: AuditOutcome = "denied" if isinstance(exc, AuthError) else "error"
        record_event(session, actor, action, target, outcome, {"error": exc.message})
        session.commit()
        raise


def list_events(
    session: Session,
    *,
    since: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
) -> list[AuditEvent]:
    """Return events, newest first; `action` ending in '*' matches a prefix ('deploy.*')."""
    query = select(AuditEvent).order_by(AuditEvent.ts.desc(), AuditEvent.id.desc()).limit(min(limit, MAX_LIMIT))
    if since is not None:
        query = query.where(AuditEvent.ts >= since)
    if actor:
        query = query.where(AuditEvent.actor == actor)
    if action:
        if action.endswith("*"):
            query = query.where(AuditEvent.action.startswith(action[:-1], autoescape=True))
        else:
            query = query.where(AuditEvent.action == action)
    if outcome:
        query = query.where(AuditEvent.outcome == outcome)
    return list(session.scalars(query))


def event_to_dict(event: AuditEvent) -> dict[str, Any]:
    """Return the event as the API shows it."""
    return {
        "id": event.id,
        "ts": event.ts.isoformat(),
        "actor": event.actor,
        "actor_kind": event.actor_kind,
        "action": event.action,
        "target": event.target,
        "outcome": event.outcome,
        "detail": event.detail,
        "address": event.address,
        "request_id": event.request_id,
    }
