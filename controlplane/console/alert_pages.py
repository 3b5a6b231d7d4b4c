"""The alerts pages: firing, pending, silenced and resolved alerts, silences, rules, deliveries; one alert."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from flask import Response, url_for
from sqlalchemy import select

from alerts.lifecycle import Silence
from alerts.rules import Rule
from controlplane.alerting.evaluator import as_silence
from controlplane.alerting.readmodel import alert_json, alert_timeline, list_silences, silence_json
from controlplane.console.base import bp, login_required, page
from controlplane.context import current_services, get_db
from controlplane.errors import NotFound
from controlplane.models import AlertRecord, OutboxMessage, SilenceRecord

RESOLVED_SHOWN = 50
DELIVERIES_SHOWN = 50
REFRESH_S = 10


def _active_silences(rows: list[SilenceRecord], now: datetime) -> list[tuple[SilenceRecord, Silence]]:
    return [(row, as_silence(row)) for row in rows if row.expired_by is None and row.starts_at <= now < row.ends_at]


def duration_text(span: timedelta) -> str:
    """Write a duration as people write it in rules: 90s -> '1m30s', 0 -> '0s'."""
    seconds, parts = int(span.total_seconds()), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def rule_json(rule: Rule) -> dict[str, Any]:
    """Describe a rule for people: its condition in one line, why its severity, its runbook."""
    c = rule.condition
    return {
        "name": rule.name, "severity": rule.severity.value, "why": rule.why, "description": rule.description,
        "condition": f"{c.aggregation}({c.metric}) over {duration_text(c.window)} {c.op} {c.threshold:g}" + (f" by {', '.join(c.by)}" if c.by else ""),
        "for": duration_text(rule.for_), "runbook": rule.runbook, "automatic": rule.automatic.enabled,
    }  # fmt: skip


def runbook_link(rule: Rule | None, labels: dict[str, str]) -> str | None:
    """Return the console link that opens the rule's runbook with its parameters filled from the alert."""
    if rule is None or not rule.runbook:
        return None
    params = {key: rule.render(template, labels, None) for key, template in rule.runbook_params.items()}
    query = f"?{urlencode(params)}" if params else ""
    return url_for("console.runbook", name=rule.runbook) + query


def _decorate(row: AlertRecord, rules: dict[str, Rule], silenced_by: int | None) -> dict[str, Any]:
    rule = rules.get(row.rule)
    return {**alert_json(row), "silenced_by": silenced_by, "runbook": rule.runbook if rule else None,
            "runbook_link": runbook_link(rule, row.labels)}  # fmt: skip


@bp.get("/alerts")
@login_required
def alerts() -> Response:
    """Alerts by state, silences, the rules with their runbooks, and the latest chat deliveries."""
    db, now = get_db(), datetime.now(UTC)
    rules = current_services().alerts.rules
    silence_rows = list_silences(db)
    active = _active_silences(silence_rows, now)
    groups: dict[str, list[dict[str, Any]]] = {"firing": [], "pending": [], "silenced": [], "resolved": []}
    rows = db.scalars(select(AlertRecord).where(AlertRecord.state.in_(("firing", "pending", "resolved"))))
    for row in sorted(rows, key=lambda r: (r.severity, r.rule, r.fingerprint)):
        muting = next((rec.id for rec, s in active if s.mutes(row.labels, now)), None)
        group = "silenced" if muting is not None and row.state != "resolved" else row.state
        groups[group].append(_decorate(row, rules, muting))
    groups["resolved"] = sorted(groups["resolved"], key=lambda a: a["resolved_at"] or "", reverse=True)[:RESOLVED_SHOWN]
    deliveries = db.scalars(select(OutboxMessage).order_by(OutboxMessage.id.desc()).limit(DELIVERIES_SHOWN))
    return page(
        "console/alerts.html",
        groups=groups,
        silences=[silence_json(r) for r in silence_rows[:100]],
        rules=[rule_json(r) for r in sorted(rules.values(), key=lambda r: (r.severity, r.name))],
        deliveries=[
            {
                "id": m.id,
                "receiver": m.receiver,
                "group": m.group_key,
                "status": m.status,
                "state": m.state,
                "attempts": m.attempts,
                "error": m.last_error,
                "created_at": m.created_at.isoformat(),
                "sent_at": m.sent_at.isoformat() if m.sent_at else None,
            }
            for m in deliveries
        ],  # fmt: skip
        refresh_s=REFRESH_S,
    )


@bp.get("/alerts/<fingerprint>")
@login_required
def alert(fingerprint: str) -> Response:
    """One alert: its labels and rule, its runbook, its timeline (state changes, deliveries, runs, acks)."""
    db = get_db()
    row = db.get(AlertRecord, fingerprint)
    if row is None:
        raise NotFound(f"no alert {fingerprint}")
    rules = current_services().alerts.rules
    rule = rules.get(row.rule)
    now = datetime.now(UTC)
    active = _active_silences(list(db.scalars(select(SilenceRecord))), now)
    muting = next((rec.id for rec, s in active if s.mutes(row.labels, now)), None)
    return page(
        "console/alert.html",
        alert=_decorate(row, rules, muting),
        rule=rule_json(rule) if rule else None,
        timeline=list(reversed(alert_timeline(db, fingerprint))),
        refresh_s=REFRESH_S,
    )
