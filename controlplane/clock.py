"""The one clock the control plane reads: timezone-aware UTC, so stored and compared times agree."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Return the current time in UTC, timezone-aware."""
    return datetime.now(UTC)
