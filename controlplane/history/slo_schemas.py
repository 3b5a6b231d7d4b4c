"""The SLO status API's query and response models (`/api/history/slos`, `/api/history/slos/<name>`)."""

from __future__ import annotations

from pydantic import Field

from alerts.slo import SLI
from alerts.states import Severity
from controlplane.contract import QueryArgs, Reply, Timestamp


class SloQuery(QueryArgs):
    """Which SLOs to describe."""

    model: str | None = Field(None, description="only this model's SLOs")


class WindowBurn(Reply):
    """How fast the budget burned over one alert window ending now; null burn rate with no requests."""

    window: str = Field(description="e.g. 5m, 1h, 3d")
    burn_rate: float | None = Field(description="bad share / allowed share: 1 spends the budget in exactly the period")
    good: int
    total: int


class BurnAlert(Reply):
    """One generated alert rule: its severity, windows and factor, and whether both windows burn above it now."""

    rule: str
    severity: Severity
    long: str
    short: str
    factor: float
    burning: bool


class SloStatus(Reply):
    """One SLO now: objective, period, good/total requests over it, the budget left, the burn rates."""

    name: str
    model: str
    sli: SLI
    objective_percent: float = Field(description="percent of requests that must be good over the period")
    threshold_ms: float | None = Field(description="latency SLOs: a good request finished within this")
    period: str
    start: Timestamp
    end: Timestamp
    good: int
    total: int
    budget_remaining_percent: float | None = Field(
        description="share of the period's error budget not yet spent; below 0 once overspent, null with no requests"
    )
    burn_rates: list[WindowBurn]
    alerts: list[BurnAlert]
    words: str = Field(description="the objective in words")


class SloList(Reply):
    slos: list[SloStatus]
