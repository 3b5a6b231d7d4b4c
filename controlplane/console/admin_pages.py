"""The audit log and the settings page: chat receivers (with a test button), users and roles, API tokens."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Response, request

from alerts.notifiers import NOTIFIERS
from controlplane.alerting.readmodel import list_receivers, receiver_json
from controlplane.auth import tokens, users
from controlplane.auth.audit import MAX_LIMIT, event_to_dict, list_events
from controlplane.auth.roles import Role
from controlplane.console.base import actor, bp, can, login_required, page
from controlplane.db import get_db

AUDIT_SHOWN = 200
OUTCOMES = ("ok", "denied", "error")


@bp.get("/audit")
@login_required
def audit() -> Response:
    """Audit events, newest first, filtered by actor, action (a trailing * matches a prefix) and outcome."""
    filters = {key: request.args.get(key, "").strip() for key in ("actor", "action", "outcome")}
    if filters["outcome"] not in ("", *OUTCOMES):
        filters["outcome"] = ""
    events = list_events(
        get_db(),
        since=None,
        actor=filters["actor"] or None,
        action=filters["action"] or None,
        outcome=filters["outcome"] or None,
        limit=min(AUDIT_SHOWN, MAX_LIMIT),
    )
    return page("console/audit.html", events=[event_to_dict(e) for e in events], filters=filters, outcomes=OUTCOMES)


@bp.get("/settings")
@login_required
def settings() -> Response:
    """Receivers, users (admins see and change them) and API tokens (yours; an admin sees everyone's)."""
    db, who, now = get_db(), actor(), datetime.now(UTC)
    receivers = [receiver_json(r) for r in list_receivers(db)]
    people = [users.user_to_dict(u) for u in users.list_users(db)] if can(Role.ADMIN) else []
    owner = None if who.role >= Role.ADMIN else who.user_id
    shown_tokens = [tokens.token_to_dict(t, user, now) for t, user in tokens.list_tokens(db, owner)]
    return page(
        "console/settings.html",
        receivers=receivers,
        kinds=sorted(NOTIFIERS),
        users=people,
        roles=[r.value for r in Role],
        tokens=shown_tokens,
        grantable=[r.value for r in Role if r <= who.role],
    )
