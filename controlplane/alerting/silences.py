"""Stored silences as the lifecycle sees them: the ones that may mute now (the evaluator and the outbox)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.lifecycle import Matcher, Silence
from controlplane.models import SilenceRecord


def as_silence(row: SilenceRecord) -> Silence:
    """Return the lifecycle's view of a stored silence (an expired one ends when it was expired)."""
    matchers = tuple(Matcher(m["label"], m["value"], bool(m.get("regex"))) for m in row.matchers)
    return Silence(matchers, row.starts_at, row.ends_at)


def active_silences(session: Session, now: datetime) -> list[SilenceRecord]:
    """The silences not yet ended nor expired at `now` (one starting later is returned; `Silence.mutes` waits)."""
    return list(
        session.scalars(select(SilenceRecord).where(SilenceRecord.ends_at > now, SilenceRecord.expired_by.is_(None)))
    )
