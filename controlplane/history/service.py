"""The history service: what the API, the CLI, the dashboards (and later alerts and rollouts) read."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from alerts.slo import SLO
from controlplane.history import drift, query
from controlplane.history.slo import ClosedHours, slo_status
from controlplane.models import AlertEvent, AlertRecord, Rollout, RolloutMeasurement


class HistoryService:
    """Read the history through one object, each call in its own short session."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._closed_hours = ClosedHours()  # an SLO's period (30 days) is then read at its ends, not row by row

    def series(
        self,
        metric: str,
        start: datetime,
        end: datetime,
        step_s: int,
        model: str | None = None,
        version: str | None = None,
        slot: str | None = None,
    ) -> list[dict]:
        """Return the series of one metric (see alerts.catalogue.METRICS)."""
        with self._sessions() as session:
            return query.series(session, metric, start, end, step_s, model, version, slot)

    def summary(self, start: datetime, end: datetime, model: str | None = None) -> list[dict]:
        """Return key figures per model/version/slot over a range."""
        with self._sessions() as session:
            return query.summary(session, start, end, model)

    def batch_distribution(self, start: datetime, end: datetime, model: str | None = None) -> list[dict]:
        """Return batch-size counts per model/version/slot over a range."""
        with self._sessions() as session:
            return query.batch_distribution(session, start, end, model)

    def slo_status(self, slos: Iterable[SLO], now: datetime) -> list[dict]:
        """Return each SLO's objective, good/total over its period, budget left and burn rate per window."""
        with self._sessions() as session:
            return [slo_status(session, slo, now, self._closed_hours) for slo in slos]

    def drift_series(self, start: datetime, end: datetime, step_s: int, model: str | None = None) -> list[dict]:
        """Return each version's drift scores over the range, a point per step, against its reference."""
        with self._sessions() as session:
            found = []
            for m, version in drift.versions_seen(session, start, end, model):
                found.extend(drift.drift_series(session, m, version, start, end, step_s)[1])
            return found

    def markers(self, start: datetime, end: datetime, model: str | None = None) -> list[dict]:
        """Return rollout starts, step verdicts and endings, and alert firings, to mark on time axes."""
        with self._sessions() as session:
            rollouts = select(Rollout).where(
                (Rollout.created_at.between(start, end)) | (Rollout.finished_at.between(start, end))
            )
            steps = (
                select(RolloutMeasurement, Rollout)
                .join(Rollout, RolloutMeasurement.rollout_id == Rollout.id)
                .where(RolloutMeasurement.ts.between(start, end))
            )
            if model is not None:
                rollouts = rollouts.where(Rollout.model == model)
                steps = steps.where(Rollout.model == model)
            marks = []
            for r in session.scalars(rollouts):
                change = f"{r.model} {r.from_version or '-'} -> {r.to_version}"
                if start <= r.created_at <= end:
                    marks.append(
                        {
                            "time": r.created_at.isoformat(),
                            "kind": "rollout",
                            "text": f"{change} started ({r.strategy})",
                        }
                    )
                if r.finished_at is not None and start <= r.finished_at <= end:
                    marks.append({"time": r.finished_at.isoformat(), "kind": "rollout", "text": f"{change} {r.state}"})
            for m, r in session.execute(steps):
                text = f"{r.model} {r.to_version} step {m.step_index + 1}: {m.verdict}"
                marks.append({"time": m.ts.isoformat(), "kind": "rollout", "text": text})
            firings = (
                select(AlertEvent, AlertRecord)
                .join(AlertRecord, AlertEvent.fingerprint == AlertRecord.fingerprint)
                .where(AlertEvent.kind == "state", AlertEvent.state == "firing", AlertEvent.ts.between(start, end))
            )
            for event, alert in session.execute(firings):
                if model is None or alert.labels.get("model") in (None, model):
                    text = f"{alert.severity} {alert.rule}: {alert.summary}"
                    marks.append({"time": event.ts.isoformat(), "kind": "alert", "text": text})
        return sorted(marks, key=lambda mark: mark["time"])
