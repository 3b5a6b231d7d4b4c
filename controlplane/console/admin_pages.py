"""The audit log and the settings page: chat receivers (with a test button), users, their sessions, API tokens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import Response, request

from alerts.notifiers import NOTIFIERS
from controlplane.alerting.readmodel import list_receivers, receiver_json
from controlplane.auth import login_sessions, tokens, users
from controlplane.auth.audit import MAX_LIMIT, event_to_dict, list_events
from controlplane.auth.roles import Role
from controlplane.console.base import actor, bp, can, login_required, page
from controlplane.context import current_services, get_db

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
    """Receivers, users and their live sessions (admins see and change them), API tokens (an admin sees everyone's)."""
    db, who, now = get_db(), actor(), datetime.now(UTC)
    receivers = [receiver_json(r, current_services().receiver_keys) for r in list_receivers(db)]
    accounts = users.list_users(db) if can(Role.ADMIN) else []
    people = [users.user_to_dict(u) for u in accounts]
    idle = timedelta(minutes=current_services().settings.session_idle_minutes)
    logins = [
        {"user": u.name, **login_sessions.session_to_dict(row, idle)}
        for u in accounts
        for row in login_sessions.live_sessions(db, u.id, now, idle)
    ]
    owner = None if who.role >= Role.ADMIN else who.user_id
    shown_tokens = [tokens.token_to_dict(t, user, now) for t, user in tokens.list_tokens(db, owner)]
    return page(
        "console/settings.html",
        receivers=receivers,
        kinds=sorted(NOTIFIERS),
        users=people,
        logins=logins,
        roles=[r.value for r in Role],
        tokens=shown_tokens,
        grantable=[r.value for r in Role if r <= who.role],
    )
