"""Canary analysis: compare the candidate slot with the stable one over a step's recorded outcomes.

Pure: takes the two slots' aggregates (from the history) and a policy, returns a verdict with the
reasons and every figure it used, so the console can show why a rollout moved or stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.history.query import SlotAggregate
from controlplane.rollout.states import Verdict


@dataclass(frozen=True)
class AnalysisPolicy:
    """Thresholds for a step's verdict; a rollout stores its own copy."""

    min_requests: int = 50  # fewer canary requests than this: inconclusive, never a pass
    max_error_rate: float = 0.01
    max_timeout_rate: float = 0.01
    max_error_rate_increase: float = 0.005  # canary minus stable
    max_p99_ratio: float = 1.5  # canary p99 over stable p99
    slo_p99_ms: float = 1000.0  # absolute ceiling on the canary's p99
    min_agreement: float = 0.99  # shadow mode: share of compared outputs that agree

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AnalysisPolicy:
        """Build a policy from JSON, refusing unknown keys."""
        data = dict(data or {})
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown analysis setting(s) {unknown}")
        return cls(**{k: type(getattr(cls, k))(v) for k, v in data.items()})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Analysis:
    """A step's verdict, why, and the figures behind it."""

    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)


def analyse(
    candidate: SlotAggregate,
    stable: SlotAggregate | None,
    policy: AnalysisPolicy,
    agreement: tuple[int, int] | None = None,
) -> Analysis:
    """Judge a step: fail on any breached threshold, inconclusive on too little data, else pass.

    `agreement` is (agreeing, compared) shadow outputs, when the rollout shadows. Errors are server
    errors only: requests the model refused for their own input (400s) are shown, never judged, so
    no client can fail a rollout, or trigger a rollback, by sending bad input.
    """
    seconds = 1.0  # rates below are ratios of counts; seconds only matter for throughput
    figures: dict[str, float | None] = {
        "requests": float(candidate.requests),
        "error_rate": candidate.value("error_rate", seconds),
        "client_error_rate": candidate.value("client_error_rate", seconds),
        "timeout_rate": candidate.value("timeout_rate", seconds),
        "p99_ms": candidate.value("p99", seconds),
        "stable_requests": float(stable.requests) if stable else None,
        "stable_error_rate": stable.value("error_rate", seconds) if stable else None,
        "stable_p99_ms": stable.value("p99", seconds) if stable else None,
    }
    if agreement is not None:
        agreeing, compared = agreement
        figures["agreement"] = agreeing / compared if compared else None
        figures["compared"] = float(compared)
    failures = []
    if figures["error_rate"] is not None and figures["error_rate"] > policy.max_error_rate:
        failures.append(f"error rate {figures['error_rate']:.2%} is over {policy.max_error_rate:.2%}")
    if figures["timeout_rate"] is not None and figures["timeout_rate"] > policy.max_timeout_rate:
        failures.append(f"timeout rate {figures['timeout_rate']:.2%} is over {policy.max_timeout_rate:.2%}")
    stable_errors = figures["stable_error_rate"]
    if figures["error_rate"] is not None and stable_errors is not None:
        if figures["error_rate"] - stable_errors > policy.max_error_rate_increase:
            failures.append(
                f"error rate {figures['error_rate']:.2%} exceeds the stable version's {stable_errors:.2%} "
                f"by more than {policy.max_error_rate_increase:.2%}"
            )
    p99, stable_p99 = figures["p99_ms"], figures["stable_p99_ms"]
    if p99 is not None and p99 > policy.slo_p99_ms:
        failures.append(f"p99 {p99:.1f} ms is over the SLO of {policy.slo_p99_ms:.0f} ms")
    if p99 is not None and stable_p99 and p99 > stable_p99 * policy.max_p99_ratio:
        failures.append(f"p99 {p99:.1f} ms is over {policy.max_p99_ratio:g} x the stable version's {stable_p99:.1f} ms")
    if agreement is not None and figures.get("agreement") is not None and figures["agreement"] < policy.min_agreement:
        failures.append(f"shadow outputs agree {figures['agreement']:.2%}, under {policy.min_agreement:.2%}")
    # A failure is a failure even on few requests: ten errors in ten requests need no more data.
    if failures and candidate.requests >= min(policy.min_requests, 10):
        return Analysis(Verdict.FAIL, failures, figures)
    if candidate.requests < policy.min_requests:
        return Analysis(
            Verdict.INCONCLUSIVE,
            [
                f"only {candidate.requests} requests reached the candidate; {policy.min_requests} are needed for a verdict"
            ],
            figures,
        )
    return Analysis(Verdict.PASS, ["every threshold held"], figures)
