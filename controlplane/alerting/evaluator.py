"""The evaluator job (scheduler leader only): rules over the history -> alert state, timeline, outbox.

Pure decisions come from `alerts.lifecycle`; this module only reads inputs and writes the outcome
in one transaction, so a crash between evaluating and notifying loses nothing: the outbox row
(`notify.py`: aggregation groups, supersession) is committed with the state change that caused it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.lifecycle import Silence, Tracked, decide, evaluate
from alerts.rules import Insufficient, Rule
from alerts.states import AlertState, Severity
from controlplane.alerting.notify import queue_notifications, record_suppressed, withdraw_muted
from controlplane.alerting.observe import observe_all
from controlplane.alerting.silences import active_silences, as_silence
from controlplane.clock import utcnow
from controlplane.history.slo import ClosedHours
from controlplane.models import AlertEvent, AlertRecord, RunbookRun
from controlplane.runbooks.automatic import Skipped
from controlplane.runbooks.states import RunState

log = logging.getLogger(__name__)

FINISHED_RUNS = frozenset(
    s.value for s in (RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.REJECTED, RunState.EXPIRED)
)
# Called for a firing alert whose rule may run its runbook by itself; returns a run id or raises.
RunAutomatic = Callable[[Rule, AlertRecord], str]
# What a rule sees at `now`: one value (or Insufficient) per label set; `observe.observe` unless a test scripts it.
Observe = Callable[[Session, Rule, datetime], dict[tuple[tuple[str, str], ...], float | Insufficient]]


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


def _silences(session: Session, now: datetime) -> list[Silence]:
    return [as_silence(r) for r in active_silences(session, now)]


def alert_payload(alert: Tracked, rule: Rule | None, settings: EvaluatorSettings, status: str) -> dict:
    """Describe one alert for a message: what, how bad, the value, where to look and what to run."""
    labels = alert.labels
    summary = rule.render(rule.summary, labels, alert.value) if rule else alert.rule
    description = rule.render(rule.description, labels, alert.value) if rule and rule.description else ""
    annotations = {"summary": summary, **({"description": description} if description else {})}  # no empty one
    runbook = rule.runbook if rule else None
    params = {
        k: v.format_map(defaultdict(lambda: "?", labels)) for k, v in (rule.runbook_params if rule else {}).items()
    }
    command = f"python runbooks/{runbook}.py " + " ".join(f"--{k} {v}" for k, v in params.items()) if runbook else ""
    # A resolved alert's value says why it resolved: back within the threshold (the value now), no data,
    # or too little traffic to judge; never the last firing value.
    value_text = alert.reason if status == "resolved" else ""
    return {
        "fingerprint": alert.fingerprint,
        "name": alert.rule,
        "severity": alert.severity.value,
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "value": alert.value,
        "value_text": value_text,
        "starts_at": (alert.firing_since or alert.pending_since).isoformat()
        if (alert.firing_since or alert.pending_since)
        else None,
        "ends_at": alert.resolved_at.isoformat() if status == "resolved" and alert.resolved_at else None,
        "runbook_url": f"{settings.console_url}/runbooks/{runbook}" if runbook else "",
        "docs_url": f"{settings.console_url}/docs/alerts/{alert.rule}/",  # the rule's page: what to check
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
        observer: Observe | None = None,
    ) -> None:
        self._sessions = sessions
        self._observer = observer
        self.rules = {r.name: r for r in rules}
        self._settings = settings
        self._engine_ready = engine_ready
        self._run_automatic = run_automatic
        self._clock = clock
        self._closed_hours = ClosedHours()  # the burn windows' whole past hours, read once, not every evaluation

    def run(self) -> dict[str, int]:
        """One evaluation: state changes, notifications queued, suppressions, automatic runs started."""
        now = self._clock()
        counts = {"changed": 0, "queued": 0, "withdrawn": 0, "suppressed": 0, "automatic": 0, "escalated": 0}
        with self._sessions() as session, session.begin():
            rows = {r.fingerprint: r for r in session.scalars(select(AlertRecord))}
            counts["escalated"] = self._follow_runbooks(session, rows.values(), now)
            before = {fp: _tracked(r) for fp, r in rows.items()}
            advanced: list[Tracked] = []
            observed = self._observe(session, now)
            for rule in self.rules.values():
                tracked = {fp: t for fp, t in before.items() if t.rule == rule.name}
                advanced += evaluate(rule, observed[rule.name], tracked, now)
            outcome = decide(advanced, before, _silences(session, now), now)
            for alert in outcome.tracked.values():
                rows[alert.fingerprint] = self._save(session, rows.get(alert.fingerprint), alert, now)
            for alert in outcome.changed:
                labels = ",".join(f"{k}={v}" for k, v in alert.labels.items())
                log.info(
                    "alert %s %s %s [%s] value %s", alert.rule, alert.state.value, alert.severity, labels, alert.value
                )
                session.add(
                    AlertEvent(
                        fingerprint=alert.fingerprint,
                        ts=now,
                        kind="state",
                        state=alert.state.value,
                        value=alert.value,
                        detail={"reason": alert.reason} if alert.reason else {},
                    )
                )
            counts["changed"] = len(outcome.changed)
            counts["suppressed"] = record_suppressed(session, outcome, now)
            session.flush()  # the states just decided are what the withdrawal's inhibition reads
            counts["withdrawn"] = withdraw_muted(session, now)
            counts["queued"] = queue_notifications(
                session, outcome, rows, self._payload, self._settings.repeat_interval, self._settings.console_url, now
            )
            counts["automatic"] = self._automatic(session, rows, outcome.tracked, now)
        return counts

    def _observe(self, session: Session, now: datetime) -> dict[str, dict]:
        """Every rule's observation, by rule name."""
        if self._observer is not None:
            return {rule.name: self._observer(session, rule, now) for rule in self.rules.values()}
        return observe_all(
            session,
            list(self.rules.values()),
            now,
            engine_ready=self._engine_ready,
            max_queue_size=self._settings.max_queue_size,
            closed_hours=self._closed_hours,
        )

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
                    row.last_notified_at = (
                        None  # shown as not yet told at P0 (dispatch sends the escalation because the severity is new)
                    )
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
        if rule and alert.value is None and alert.reason:
            row.summary += f" ({alert.reason})"  # no value to show: say why (no data, too little traffic)
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
        if session.is_modified(row) or row.updated_at is None:
            # NOTE: only then: stamping every row every evaluation made an idle server write (and wake every
            # worker's change watch) every 15 s for nothing.
            row.updated_at = now
        return row

    def _payload(self, alert: Tracked, status: str) -> dict:
        return alert_payload(alert, self.rules.get(alert.rule), self._settings, status)

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
            attempt = row.runbook_attempts + 1
            try:
                detail = {"runbook": rule.runbook, "run": self._run_automatic(rule, row), "attempt": attempt}
            except Skipped as skipped:  # another run acts on the target, or its cooldown runs: no attempt spent
                self._record_skip(session, alert, rule, skipped, now)
                continue
            except Exception as exc:  # the runbook failing to start is recorded, not fatal to evaluation
                log.exception("automatic runbook %s for %s failed to start", rule.runbook, fp)
                detail = {"runbook": rule.runbook, "error": str(exc), "attempt": attempt}
            row.runbook_attempts, row.last_runbook_at = attempt, now
            session.add(
                AlertEvent(
                    fingerprint=fp, ts=now, kind="runbook", state=alert.state.value, value=alert.value, detail=detail
                )
            )
            started += 1
        return started

    def _record_skip(self, session: Session, alert: Tracked, rule: Rule, skipped: Skipped, now: datetime) -> None:
        """Say on the alert's timeline why its runbook was not started, once per blocking run."""
        last = session.scalars(
            select(AlertEvent)
            .where(AlertEvent.fingerprint == alert.fingerprint, AlertEvent.kind.in_(("runbook", "runbook_skipped")))
            .order_by(AlertEvent.id.desc())
        ).first()
        if last is None or last.kind != "runbook_skipped" or last.detail.get("blocker") != skipped.blocker:
            detail = {"runbook": rule.runbook, "why": skipped.why, "blocker": skipped.blocker}
            session.add(AlertEvent(fingerprint=alert.fingerprint, ts=now, kind="runbook_skipped",
                                   state=alert.state.value, value=alert.value, detail=detail))  # fmt: skip
