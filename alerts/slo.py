"""Service level objectives: per-model targets, their error budgets, and the burn-rate alerts made from them.

Declared in a rule file's `slos:` list (alerts/rules/slo.yaml), validated at load like the rules:

slos:
  - name: mlp_availability
    model: mlp
    sli: availability      # bad: server errors, timeouts, queue-full refusals; a client's 400 never
    objective: 99.9        # percent of requests that must be good over the period
    period: 30d
  - name: mlp_latency
    model: mlp
    sli: latency           # good: requests that ran and finished within threshold_ms
    objective: 99
    threshold_ms: 250
    period: 30d

The error budget is the share of requests allowed to be bad (0.1% for 99.9%); the burn rate is how
fast it is spent (the bad share over a window divided by the allowed share: 1 spends exactly the
budget in the period). Each SLO yields one alert rule per row of `WINDOWS` (multi-window,
multi-burn-rate alerting), generated here and evaluated like any other rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from alerts.rules import Automatic, Condition, Duration, Rule, RuleError, TextMapping, duration_text, item, unique
from alerts.states import Severity
from serving.declared import Declared, Problem, describe, message

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")  # leaves room for the rule suffix "_burn_3d" within 64
BURN_METRIC = "slo_burn_rate"

# libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents, ~10x faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SLI(StrEnum):
    """What a request must be to count as good."""

    AVAILABILITY = "availability"  # answered without a server error, a timeout or a queue-full refusal
    LATENCY = "latency"  # ran and finished within the threshold


@dataclass(frozen=True)
class SLO:
    """One model's objective: `objective` (a fraction) of its requests good over `period`."""

    name: str
    model: str
    sli: SLI
    objective: float
    period: timedelta = timedelta(days=30)
    threshold_ms: float | None = None
    min_requests: int | None = None  # None: `minimum` derives one per burn factor
    runbook: str = "diagnostics"
    runbook_params: dict[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def budget(self) -> float:
        """The share of requests allowed to be bad (0.001 for 99.9%)."""
        return 1.0 - self.objective

    def minimum(self, factor: float) -> int:
        """The fewest requests a window needs before a burn above `factor` is judged.

        Declared (`min_requests`), or by default the fewest at which one bad request alone is not
        a burn above `factor`: 1 / (budget x factor), plus one. For 99.9% that is 70 requests for the
        14.4x page and 167 for the 6x one; for 99%, 7 and 17. Below it a single failure would page
        (one in 18 requests is a 55x burn of a 99.9% budget), so the alert says "not enough traffic".
        """
        if self.min_requests is not None:
            return self.min_requests
        return max(1, math.floor(1 / (self.budget * factor) + 1e-9) + 1)

    def words(self) -> str:
        """Say the objective as people do: 'availability 99.9% over 30d', 'latency 99% under 250 ms over 30d'."""
        under = f" under {self.threshold_ms:g} ms" if self.sli is SLI.LATENCY else ""
        return f"{self.sli.value} {self.objective * 100:g}%{under} over {duration_text(self.period)}"


@dataclass(frozen=True)
class BurnWindow:
    """Alert when `budget_spent` of the period's budget goes within `long`, confirmed over `short`."""

    severity: Severity
    budget_spent: float
    long: timedelta
    short: timedelta

    def factor(self, period: timedelta) -> float:
        """The burn rate that spends `budget_spent` of the budget within `long` (14.4 for 2% in 1h of 30d)."""
        return round(self.budget_spent * (period / self.long), 6)


# The Google SRE Workbook, chapter 5 "Alerting on SLOs", approach 6 "Multiwindow, Multi-Burn-Rate Alerts",
# Table 5-8 "Recommended parameters for a 99.9% SLO alerting configuration": page at 2% of the budget in 1h
# (14.4x over 1h, confirmed over 5m), page at 5% in 6h (6x over 6h and 30m), ticket at 10% in 3d (1x over
# 3d and 6h); the short window is 1/12 of the long one so an alert resets soon after the burn stops. The
# table has no 1-day row: the 10%-in-1d ticket (3x over 1d and 2h) is the one the Kubernetes monitoring
# mixin and Sloth add between the 6h page and the 3d ticket. The factors are derived from the budget
# share, so a 7d or 28d period gets the factors that spend the same shares (14.4 holds for 30 days).
WINDOWS: tuple[BurnWindow, ...] = (
    BurnWindow(Severity.P0, 0.02, timedelta(hours=1), timedelta(minutes=5)),
    BurnWindow(Severity.P0, 0.05, timedelta(hours=6), timedelta(minutes=30)),
    BurnWindow(Severity.P1, 0.10, timedelta(days=1), timedelta(hours=2)),
    BurnWindow(Severity.P1, 0.10, timedelta(days=3), timedelta(hours=6)),
)
# Every window some burn alert reads, shortest first (each is recorded, and shown, once).
ALERT_WINDOWS: tuple[timedelta, ...] = tuple(sorted({w.long for w in WINDOWS} | {w.short for w in WINDOWS}))


def burn_rate(bad: int, total: int, slo: SLO) -> float | None:
    """The bad share of `total` over the allowed share; None with no requests."""
    if total <= 0:
        return None
    return (bad / total) / slo.budget


def budget_remaining(bad: int, total: int, slo: SLO) -> float | None:
    """The share of the period's budget not yet spent (below 0 once overspent); None with no requests."""
    rate = burn_rate(bad, total, slo)
    return None if rate is None else 1.0 - rate


@dataclass(frozen=True)
class BurnRule(Rule):
    """A rule generated from an SLO: its value is the lower of the burn rates over the long and short window."""

    slo: SLO | None = None
    short_window: timedelta = timedelta(0)


def rule_name(slo: SLO, window: BurnWindow) -> str:
    """Name the alert rule one window of an SLO generates: '<slo>_burn_<long window>'."""
    return f"{slo.name}_burn_{duration_text(window.long)}"


def burn_rules(slos: Iterable[SLO], windows: Sequence[BurnWindow] = WINDOWS) -> list[BurnRule]:
    """Return the alert rules of every SLO, one per burn window: P0 pages for a fast burn, P1 tickets for a slow one."""
    rules = []
    for slo in slos:
        for window in windows:
            factor = window.factor(slo.period)
            long, short = duration_text(window.long), duration_text(window.short)
            lasts = slo.period / factor
            kind = "page now" if window.severity is Severity.P0 else "a ticket for working hours, not a page"
            rules.append(
                BurnRule(
                    name=rule_name(slo, window),
                    severity=window.severity,
                    why=f"{window.budget_spent:.0%} of the {duration_text(slo.period)} error budget spent within {long}; at "
                    f"{factor:g}x the whole budget lasts {_days(lasts)}: {kind}",
                    condition=Condition(BURN_METRIC, "min", window.long, ">", factor, ("model",)),
                    for_=timedelta(0),  # the short window already confirms the burn is still going on
                    summary=f"{{model}}: the error budget of {slo.words()} burns at {{value:.1f}}x over {long} "
                    f"and {short}",
                    description=f"Burn rate = bad share / allowed share ({slo.budget:.3g}); above {factor:g}x over "
                    f"both {long} and {short}. {slo.description}".strip(),
                    labels={"slo": slo.name, "long": long, "short": short},
                    runbook=slo.runbook,
                    runbook_params=dict(slo.runbook_params),
                    automatic=Automatic(),
                    source=f"slo {slo.name}",
                    slo=slo,
                    short_window=window.short,
                )
            )
    return rules


def _days(value: timedelta) -> str:
    hours = value.total_seconds() / 3600
    return f"{hours:.0f} hours" if hours < 48 else f"{hours / 24:.1f} days"


class _SLO(Declared):
    name: Annotated[str, Field(pattern=_NAME.pattern)]
    model: Annotated[str, Field(min_length=1)]
    sli: SLI
    objective: float
    period: Duration = timedelta(days=30)
    threshold_ms: Annotated[float, Field(gt=0)] | None = None
    min_requests: Annotated[int, Field(ge=1)] | None = None  # None: derived per alert (SLO.minimum)
    runbook: str = "diagnostics"
    runbook_params: TextMapping = Field(default_factory=dict)
    description: Any = ""

    @field_validator("sli", mode="before")
    @classmethod
    def _sli(cls, value: Any) -> SLI:
        try:
            return SLI(value)
        except ValueError:
            raise Problem(f"must be one of {[s.value for s in SLI]}, not {value!r:.100}") from None

    @field_validator("objective")
    @classmethod
    def _percentage(cls, objective: float) -> float:
        if not 0 < objective < 100:
            raise Problem(f"must be a percentage between 0 and 100 (exclusive), e.g. 99.9, not {objective!r}")
        return objective

    @field_validator("period")
    @classmethod
    def _long_enough(cls, period: timedelta) -> timedelta:
        longest = max(w.long for w in WINDOWS)
        if period < longest:
            raise Problem(f"must be at least {duration_text(longest)}, the longest alert window")
        return period

    @field_validator("runbook")
    @classmethod
    def _registered(cls, runbook: str, info: ValidationInfo) -> str:
        runbooks = (info.context or {}).get("runbooks")
        if runbooks is not None and runbook not in set(runbooks):
            raise Problem(f"runbook {runbook!r} is not a registered runbook")
        return runbook

    @model_validator(mode="after")
    def _threshold_for_latency(self) -> _SLO:
        if self.sli is SLI.LATENCY and self.threshold_ms is None:
            raise Problem("must be a number above 0 for a latency SLO", at=("threshold_ms",))
        if self.sli is not SLI.LATENCY and self.threshold_ms is not None:
            raise Problem("applies to latency SLOs only", at=("threshold_ms",))
        return self


def parse_slo(data: Any, source: str, runbooks: Iterable[str] | None = None, index: int | None = None) -> SLO:
    """Validate one `slos:` entry of file `source`; raise RuleError naming the file, the SLO and the field."""
    context = {"runbooks": None if runbooks is None else list(runbooks)}
    try:
        checked = _SLO.model_validate(data, context=context)
    except ValidationError as exc:
        raise RuleError(describe(exc, source, item("slo", data, _NAME, index))) from None
    return SLO(
        name=checked.name,
        model=checked.model,
        sli=checked.sli,
        objective=checked.objective / 100,
        period=checked.period,
        threshold_ms=checked.threshold_ms,
        runbook=checked.runbook,
        runbook_params=checked.runbook_params,
        min_requests=checked.min_requests,
        description=str(checked.description),
    )


def load_slos(folder: Path, runbooks: Iterable[str] | None = None) -> list[SLO]:
    """Load and validate the `slos:` list of every `*.yaml` in `folder` (the rules' folder)."""
    slos: list[SLO] = []
    taken: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            document = yaml.load(path.read_text(), Loader=SAFE_LOADER)
        except yaml.YAMLError as exc:
            raise RuleError(message(path.name, f"is not valid YAML: {exc}")) from None
        if not isinstance(document, dict) or "slos" not in document:
            continue
        if not isinstance(document["slos"], list):
            raise RuleError(message(path.name, "must be a list of SLOs", path="slos"))
        for i, data in enumerate(document["slos"]):
            slos.append(parse_slo(data, path.name, runbooks, i))
            unique(taken, slos[-1].name, path.name, "slo", i)
    return slos


def with_burn_rules(rules: Sequence[Rule], slos: Iterable[SLO]) -> list[Rule]:
    """Return `rules` and the rules generated from `slos`; a generated name may not repeat a written one."""
    generated = burn_rules(slos)
    clash = sorted({r.name for r in rules} & {r.name for r in generated})
    if clash:
        raise RuleError(f"rules generated from SLOs repeat rule names: {clash}")
    return [*rules, *generated]
