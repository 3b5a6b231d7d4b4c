"""Audit adapters for rollout actions: who did it is bound here, the service only says what."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from controlplane.auth import SYSTEM_ACTOR, record_event


def system_audit(session: Session, action: str, target: str, outcome: str, detail: dict[str, Any]) -> None:
    """Record what the controller did by itself (automatic promotion, rollback, scale-down)."""
    record_event(session, SYSTEM_ACTOR, action, target, outcome, detail)
