"""The history service: what the API, the CLI, the dashboards (and later alerts and rollouts) read."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from controlplane.history import query


class HistoryService:
    """Read the history through one object, each call in its own short session."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

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
        """Return the series of one metric (see query.METRICS)."""
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

    def markers(self, start: datetime, end: datetime, model: str | None = None) -> list[dict]:
        """Return events to mark on time axes. Rollout steps and alert firings join when those land."""
        return []
