"""Severities and alert states as types (one module, as the house style asks)."""

from __future__ import annotations

import enum


class Severity(enum.StrEnum):
    P0 = "P0"  # service down or severely degraded: act now
    P1 = "P1"  # degraded: act in working hours
    P2 = "P2"  # risk: handle at maintenance

    @property
    def rank(self) -> int:
        """Return 0 for the most urgent."""
        return int(self.value[1])


class AlertState(enum.StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"  # the condition holds, but not yet for the rule's `for` duration
    FIRING = "firing"
    RESOLVED = "resolved"
