"""The evaluator job (scheduler leader only): rules over the history -> alert state, timeline, outbox.

Pure decisions come from `alerts.lifecycle`; this module only reads inputs and writes the outcome
in one transaction, so a crash between evaluating and notifying loses nothing: the outbox row is
committed with the state change that caused it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.lifecycle import Matcher, Silence, Tracked, decide, evaluate, group_key
from alerts.rules import Rule
from alerts.states import AlertState, Severity
from controlplane.alerting.observe import observe
from controlplane.models import AlertEvent, AlertRecord, OutboxMessage, Receiver, RunbookRun, SilenceRecord
from controlplane.runbooks.states import RunState
from controlplane.scheduler import utcnow

log = logging.getLogger(__name__)

FINISHED_RUNS = frozenset(
    s.value for s in (RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.REJECTED, RunState.EXPIRED)
)
# Called for a firing alert whose rule may run its runbook by itself; returns a run id or raises.
RunAutomatic = Callable[[Rule, AlertRecord], str]


@dataclass(frozen=True)
class EvaluatorSettings:
    repeat_interval: timedelta = timedelta(hours=4)
    console_url: str = "http://127.0.0.1:8000"
    max_queue_size: int = 128


def _tracked(row: AlertRecord) -> Tracked:
    return Tracked(
        fingerprint=row.fingerprint, rule=row.rule, severity=Severity(row.severity), labels=dict(row.labels),
        state=AlertState(row.state), value=row.value, pending_since=row.pending_since, firing_since=row.firing_since,
        resolved_at=row.resolved_at, last_notified_at=row.last_notified_at, acknowledged_by=row.acknowledged_by,
    )  # fmt: skip


def as_silence(row: SilenceRecord) -> Silence:
    """Return the lifecycle's view of a stored silence (an expired one ends when it was expired)."""
    matchers = tuple(Matcher(m["label"], m["value"], bool(m.get("regex"))) for m in row.matchers)
    return Silence(matchers, row.starts_at, row.ends_at)


def _silences(session: Session, now: datetime) -> list[Silence]:
    rows = session.scalars(select(SilenceRecord).where(SilenceRecord.ends_at > now, SilenceRecord.expired_by.is_(None)))
    return [as_silence(r) for r in rows]


def _routes(receiver: Receiver, alert: Tracked) -> bool:
    matchers = [Matcher(m["label"], m["value"], bool(m.get("regex"))) for m in receiver.matchers or []]
    return (
        receiver.enabled
        and alert.severity.value in receiver.severities
        and all(m.matches(alert.labels) for m in matchers)
    )


def alert_payload(alert: Tracked, rule: Rule | None, settings: EvaluatorSettings, status: str) -> dict:
    """Describe one alert for a message: what, how bad, the value, where to look and what to run."""
    labels = alert.labels
    summary = rule.render(rule.summary, labels, alert.value) if rule else alert.rule
    description = rule.render(rule.description, labels, alert.value) if rule and rule.description else ""
    runbook = rule.runbook if rule else None
    params = {
        k: v.format_map(defaultdict(lambda: "?", labels)) for k, v in (rule.runbook_params if rule else {}).items()
    }
    command = f"python runbooks/{runbook}.py " + " ".join(f"--{k} {v}" for k, v in params.items()) if runbook else ""
    return {
        "fingerprint": alert.fingerprint,
        "name": alert.rule,
        "severity": alert.severity.value,
        "status": status,
        "labels": labels,
        "annotations": {"summary": summary, "description": description},
        "value": alert.value,
        "starts_at": (alert.firing_since or alert.pending_since).isoformat()
        if (alert.firing_since or alert.pending_since)
        else None,
        "ends_at": alert.resolved_at.isoformat() if status == "resolved" and alert.resolved_at else None,
        "runbook_url": f"{settings.console_url}/runbooks/{runbook}" if runbook else "",
        "runbook_command": command.strip(),
        "console_url": f"{settings.console_url}/alerts/{alert.fingerprint}",
    }


class AlertEvaluator:
    """Evaluate every rule once per call to `run()`."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        rules: list[Rule],
        settings: EvaluatorSettings,
        engine_ready: Callable[[], bool],
        run_automatic: RunAutomatic | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._sessions = sessions
        self.rules = {r.name: r for r in rules}
        self._settings = settings
        self._engine_ready = engine_ready
        self._run_automatic = run_automatic
        self._clock = clock

    def run(self) -> dict[str, int]:
        """One evaluation: state changes, notifications queued, suppressions, automatic runs started."""
        now = self._clock()
        counts = {"changed": 0, "queued": 0, "suppressed": 0, "automatic": 0, "escalated": 0}
        with self._sessions() as session, session.begin():
            rows = {r.fingerprint: r for r in session.scalars(select(AlertRecord))}
            counts["escalated"] = self._follow_runbooks(session, rows.values(), now)
            before = {fp: _tracked(r) for fp, r in rows.items()}
            advanced: list[Tracked] = []
            for rule in self.rules.values():
                observed = observe(
                    session, rule, now, engine_ready=self._engine_ready, max_queue_size=self._settings.max_queue_size
                )
                advanced += evaluate(rule, observed, {fp: t for fp, t in before.items() if t.rule == rule.name}, now)
            outcome = decide(advanced, before, _silences(session, now), now, self._settings.repeat_interval)
            for alert in outcome.tracked.values():
                rows[alert.fingerprint] = self._save(session, rows.get(alert.fingerprint), alert, now)
            for alert in outcome.changed:
                session.add(
                    AlertEvent(
                        fingerprint=alert.fingerprint,
                        ts=now,
                        kind="state",
                        state=alert.state.value,
                        value=alert.value,
                        detail={},
                    )
                )
            counts["changed"] = len(outcome.changed)
            for alert, why in outcome.suppressed:
                session.add(
                    AlertEvent(
                        fingerprint=alert.fingerprint,
                        ts=now,
                        kind="suppressed",
                        state=alert.state.value,
                        value=alert.value,
                        detail={"why": why},
                    )
                )
            counts["suppressed"] = len(outcome.suppressed)
            counts["queued"] = self._enqueue(session, outcome.notify, now)
            counts["automatic"] = self._automatic(session, rows, outcome.tracked, now)
        return counts

    def _follow_runbooks(self, session: Session, alerts: Iterable[AlertRecord], now: datetime) -> int:
        """Record how automatic runs ended on their alert; a failed one escalates a firing alert to P0."""
        escalated = 0
        for row in alerts:
            if not row.runbook_attempts:
                continue
            events = list(
                session.scalars(
                    select(AlertEvent).where(
                        AlertEvent.fingerprint == row.fingerprint, AlertEvent.kind.in_(("runbook", "runbook_result"))
                    )
                )
            )
            done = {e.detail.get("run") for e in events if e.kind == "runbook_result"}
            started = [e for e in events if e.kind == "runbook" and str(e.detail.get("run", "")).isdigit()]
            for event in (e for e in started if e.detail["run"] not in done):
                run = session.get(RunbookRun, int(event.detail["run"]))
                if run is None or run.state not in FINISHED_RUNS:
                    continue
                session.add(AlertEvent(fingerprint=row.fingerprint, ts=now, kind="runbook_result", state=row.state, value=row.value,
                                       detail={"run": event.detail["run"], "state": run.state, "error": run.error}))  # fmt: skip
                if (
                    run.state != "succeeded"
                    and row.state == AlertState.FIRING.value
                    and row.severity != Severity.P0.value
                ):
                    row.severity = Severity.P0.value
                    row.labels = {
                        **row.labels,
                        "severity": Severity.P0.value,
                        "escalated_from": row.labels.get("severity", ""),
                    }
                    row.last_notified_at = None  # the escalation goes out now, to the P0 receivers
                    escalated += 1
        return escalated

    def _save(self, session: Session, row: AlertRecord | None, alert: Tracked, now: datetime) -> AlertRecord:
        if row is None:
            row = AlertRecord(
                fingerprint=alert.fingerprint, rule=alert.rule, severity=alert.severity.value, labels=alert.labels
            )
            session.add(row)
        rule = self.rules.get(alert.rule)
        row.state, row.value = alert.state.value, alert.value
        row.summary = rule.render(rule.summary, alert.labels, alert.value) if rule else row.summary or ""
        row.pending_since, row.firing_since, row.resolved_at = (
            alert.pending_since,
            alert.firing_since,
            alert.resolved_at,
        )
        row.last_notified_at, row.acknowledged_by = alert.last_notified_at, alert.acknowledged_by
        if (
            alert.state is AlertState.PENDING
            and row.runbook_attempts
            and row.resolved_at is None
            and row.firing_since is None
        ):
            row.runbook_attempts = 0  # a new episode gets its own allowance
        row.updated_at = now
        return row

    def _enqueue(self, session: Session, notify: list[tuple[Tracked, str]], now: datetime) -> int:
        receivers = list(session.scalars(select(Receiver)))
        groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
        for alert, status in notify:
            payload = alert_payload(alert, self.rules.get(alert.rule), self._settings, status)
            for receiver in receivers:
                if _routes(receiver, alert):
                    groups[(receiver.name, group_key(alert), status)].append(payload)
            session.add(AlertEvent(fingerprint=alert.fingerprint, ts=now, kind="notified", state=alert.state.value, value=alert.value,
                                   detail={"status": status, "receivers": [r.name for r in receivers if _routes(r, alert)]}))  # fmt: skip
        for (receiver, key, status), alerts in groups.items():
            common = {k: v for k, v in alerts[0]["labels"].items() if all(a["labels"].get(k) == v for a in alerts)}
            session.add(
                OutboxMessage(
                    receiver=receiver, group_key=key, status=status, state="pending", attempts=0,
                    next_attempt_at=now, created_at=now,
                    payload={"receiver": receiver, "group_key": key, "status": status, "alerts": alerts,
                             "common_labels": common, "external_url": self._settings.console_url},
                )
            )  # fmt: skip
        return len(groups)

    def _automatic(
        self, session: Session, rows: dict[str, AlertRecord], tracked: dict[str, Tracked], now: datetime
    ) -> int:
        started = 0
        if self._run_automatic is None:
            return 0
        for fp, alert in tracked.items():
            rule = self.rules.get(alert.rule)
            row = rows[fp]
            if alert.state is not AlertState.FIRING or rule is None or not rule.automatic.enabled:
                continue
            if row.runbook_attempts >= rule.automatic.max_attempts:
                continue
            if row.last_runbook_at is not None and now - row.last_runbook_at < rule.automatic.cooldown:
                continue
            row.runbook_attempts += 1
            row.last_runbook_at = now
            try:
                run_id = self._run_automatic(rule, row)
                detail = {"runbook": rule.runbook, "run": run_id, "attempt": row.runbook_attempts}
            except Exception as exc:  # the runbook failing to start is recorded, not fatal to evaluation
                log.exception("automatic runbook %s for %s failed to start", rule.runbook, fp)
                detail = {"runbook": rule.runbook, "error": str(exc), "attempt": row.runbook_attempts}
            session.add(
                AlertEvent(
                    fingerprint=fp, ts=now, kind="runbook", state=alert.state.value, value=alert.value, detail=detail
                )
            )
            started += 1
        return started
