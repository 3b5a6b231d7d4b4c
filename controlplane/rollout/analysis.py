"""Canary analysis: judge the candidate slot against the stable one over a step's recorded outcomes.

Pure: takes the two slots' aggregates (from the history) and a policy, returns a verdict with the
reasons, the figures and the evidence of every check (its test, p-value or interval, effect size,
sample sizes and floors), so the console can show why a rollout moved or stopped. The statistics
are in `rollout.judge`.

A check fails only on evidence AND a difference that matters: a statistically significant
difference (p < alpha) that is also over its practical floor. Nothing ever passes on too little
data: a step with fewer than `min_requests` candidate requests, or with no batch size that both
slots ran, is inconclusive (it pauses for a person).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.history.query import SlotAggregate
from controlplane.rollout import judge
from controlplane.rollout.states import Verdict

# Settings an older version of Flightdeck stored with a rollout: ignored when such a rollout is read back.
RETIRED = {"max_p99_ratio": "the judge compares latency distributions; see latency_floor_ms and max_slowdown"}


@dataclass(frozen=True)
class AnalysisPolicy:
    """Thresholds for a step's verdict; a rollout stores its own copy."""

    min_requests: int = 100  # fewer canary requests than this: inconclusive, never a pass
    alpha: float = 0.001  # a difference is evidence when its one-sided p-value is under this
    max_error_rate: float = 0.01  # absolute ceiling: fails when the Wilson interval is wholly above it
    max_timeout_rate: float = 0.01
    max_error_rate_increase: float = 0.005  # candidate minus stable below this never fails
    max_timeout_rate_increase: float = 0.005
    slo_p99_ms: float = 1000.0  # the candidate's requests over this must stay under 1 %
    latency_floor_ms: float = 0.05  # a compute-time shift below this never fails ...
    latency_floor_slo_share: float = 0.0001  # ... nor one below this share of the SLO (0.1 ms of 1 s)
    max_slowdown: float = 1.25  # ... nor one under this ratio of candidate to stable compute time
    # ... and, at a step where the two slots' traffic shares differ (a 10 % canary), nor one under this:
    # a slot with a small share runs cold (its weights leave the CPU caches between its rare batches),
    # which the canary lab measured at 1.5-1.8x for an equal version at 10 %. Only gross regressions
    # fail there; the step whose shares match (35-65 %, or a shadow step) judges against max_slowdown.
    max_slowdown_unmatched: float = 3.0
    min_batches: int = 30  # candidate batches at batch sizes both slots ran, for a latency verdict
    max_label_divergence: float = 0.05  # Jensen-Shannon divergence (bits) of predicted labels
    min_labels: int = 200  # candidate predictions needed before their distribution is judged
    # Shadow mode: share of mirrored requests whose answers agree (the same predicted label for a classifier).
    min_agreement: float = 0.9

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, *, stored: bool = False) -> AnalysisPolicy:
        """Build a policy from JSON, refusing unknown keys (a `stored` one drops retired keys instead)."""
        data = dict(data or {})
        for key in RETIRED:
            if key in data:
                if not stored:
                    raise ValueError(f"analysis setting '{key}' was retired: {RETIRED[key]}")
                data.pop(key)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown analysis setting(s) {unknown}")
        return cls(**{k: type(getattr(cls, k))(v) for k, v in data.items()})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def latency_floor(self) -> float:
        """The smallest compute-time shift (ms) that may fail a step."""
        return max(self.latency_floor_ms, self.latency_floor_slo_share * self.slo_p99_ms)


@dataclass
class Analysis:
    """A step's verdict, why, the figures behind it, and each check's evidence."""

    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _sig(value: float | None) -> float | None:
    """Three significant digits: a p-value of 3e-20 stays 3e-20, not 0."""
    return None if value is None else float(f"{value:.3g}")


def _judged(agg: SlotAggregate) -> int:
    """Requests that ran or timed out: client errors and queue-full refusals are never the model's."""
    return agg.successes + agg.errors + agg.timeouts


def _proportion_check(
    name: str, k1: int, n1: int, k0: int, n0: int, ceiling: float, floor: float, alpha: float
) -> tuple[dict[str, Any], str | None]:
    """Errors or timeouts: Fisher's exact test against the stable slot, and a Wilson bound against the ceiling."""
    z = judge.normal_isf(alpha)
    interval = judge.wilson_bounds(k1, n1, z)
    rate, stable_rate = (k1 / n1 if n1 else None), (k0 / n0 if n0 else None)
    p_value = judge.fisher_greater(k1, n1, k0, n0) if n0 else None
    evidence: dict[str, Any] = {
        "check": name,
        "test": "Fisher's exact test, one-sided (candidate worse); Wilson score interval",
        "p_value": _sig(p_value),
        "interval": [_round(b) for b in interval] if interval else None,
        "effect": {"rate": _round(rate), "stable_rate": _round(stable_rate),
                   "increase": _round(rate - stable_rate) if rate is not None and stable_rate is not None else None},
        "samples": {"candidate": n1, "stable": n0, "candidate_events": k1, "stable_events": k0},
        "floors": {"alpha": alpha, "ceiling": ceiling, "max_increase": floor},
    }  # fmt: skip
    reason = None
    if interval is not None and interval[0] > ceiling:
        reason = f"{name} {rate:.2%} is over {ceiling:.2%} (interval {interval[0]:.2%}-{interval[1]:.2%})"
    elif p_value is not None and p_value < alpha and rate - stable_rate > floor:
        reason = (
            f"{name} {rate:.2%} exceeds the stable version's {stable_rate:.2%} by more than {floor:.2%} "
            f"(Fisher p = {p_value:.2g})"
        )
    evidence["outcome"] = "fail" if reason else "pass"
    return evidence, reason


def matched_share(share: float | None) -> bool:
    """Whether a step gives both slots comparable traffic: near-equal shares, or a shadow step (both get all)."""
    return share is None or share == 0 or 35 <= share <= 65


def _latency_check(
    candidate: SlotAggregate, stable: SlotAggregate, policy: AnalysisPolicy, alpha: float, share: float | None
):
    """Batch compute time at matching batch sizes: van Elteren's test, the shift, and the floors."""
    strata = {
        size: (candidate.compute[size], stable.compute[size])
        for size in sorted(set(candidate.compute) & set(stable.compute))
        if candidate.compute[size].total and stable.compute[size].total
    }
    test = judge.rank_test(strata)
    moved = judge.shift(strata)
    batches = sum(c.total for c, _ in strata.values())
    floor = policy.latency_floor
    matched = matched_share(share)
    slowdown = policy.max_slowdown if matched else policy.max_slowdown_unmatched
    evidence: dict[str, Any] = {
        "check": "latency",
        "test": "van Elteren stratified Mann-Whitney U on batch compute time, one stratum per batch size",
        "p_value": _sig(test.p_value),
        "z": _round(test.z, 3),
        "effect": {
            "superiority": _round(test.superiority, 4),
            "candidate_ms": _round(moved.candidate_ms if moved else None, 4),
            "stable_ms": _round(moved.baseline_ms if moved else None, 4),
            "difference_ms": _round(moved.difference_ms if moved else None, 4),
            "ratio": _round(moved.ratio if moved else None, 4),
        },
        "samples": {
            "candidate_batches": batches,
            "stable_batches": sum(b.total for _, b in strata.values()),
            "batch_sizes": sorted(strata),
            "candidate_batches_all": sum(h.total for h in candidate.compute.values()),
        },
        "floors": {"alpha": alpha, "min_difference_ms": floor, "max_slowdown": slowdown,
                   "min_batches": policy.min_batches, "candidate_share": share, "shares_matched": matched},
    }  # fmt: skip
    if batches < policy.min_batches or moved is None:
        evidence["outcome"] = "not_judged"
        return (
            evidence,
            None,
            (
                f"only {batches} candidate batches at batch sizes the stable version also ran; "
                f"{policy.min_batches} are needed to compare compute time"
            ),
        )
    ratio = moved.ratio or 0.0
    if test.p_value < alpha and moved.difference_ms > floor and ratio > slowdown:
        evidence["outcome"] = "fail"
        reason = (
            f"compute time {moved.candidate_ms:.3f} ms against the stable version's {moved.baseline_ms:.3f} ms "
            f"at the same batch sizes ({ratio:.2f} x, +{moved.difference_ms:.3f} ms; "
            f"van Elteren p = {test.p_value:.2g})"
        )
        return evidence, reason, None
    evidence["outcome"] = "pass"
    return evidence, None, None


def _slo_check(candidate: SlotAggregate, policy: AnalysisPolicy, alpha: float):
    """Share of the candidate's requests over the SLO: fails when its Wilson interval is wholly above 1 %."""
    n = candidate.latency.total
    over = judge.share_above(candidate.latency, policy.slo_p99_ms / 1000)
    interval = judge.wilson_bounds(over, n, judge.normal_isf(alpha))
    evidence = {
        "check": "slo",
        "test": "share of requests over the SLO, Wilson score interval (p99 <= SLO means <= 1 % over it)",
        "interval": [_round(b) for b in interval] if interval else None,
        "effect": {"p99_ms": _round(candidate.value("p99", 1.0), 4), "share_over": _round(over / n if n else None)},
        "samples": {"candidate": n, "over": over},
        "floors": {"alpha": alpha, "slo_p99_ms": policy.slo_p99_ms, "max_share_over": 0.01},
    }
    reason = None
    if interval is not None and interval[0] > 0.01:
        reason = (
            f"{over / n:.2%} of requests took over the SLO of {policy.slo_p99_ms:g} ms "
            f"(p99 {candidate.value('p99', 1.0):.1f} ms)"
        )
    evidence["outcome"] = "fail" if reason else "pass"
    return evidence, reason


def _label_checks(candidate: SlotAggregate, stable: SlotAggregate, policy: AnalysisPolicy, alpha: float):
    """Per output: Jensen-Shannon divergence of predicted labels, with a chi-square test behind it."""
    results = []
    for output in sorted(set(candidate.labels) & set(stable.labels)):
        mine, theirs = candidate.labels[output], stable.labels[output]
        n1, n0 = sum(mine.values()), sum(theirs.values())
        divergence = judge.js_divergence(mine, theirs)
        statistic, dof, p_value = judge.chi2_homogeneity(mine, theirs)
        top = max(mine, key=mine.get) if n1 else None
        stable_top = max(theirs, key=theirs.get) if n0 else None
        evidence = {
            "check": f"labels:{output}",
            "test": "Jensen-Shannon divergence of predicted labels; Pearson chi-square test of homogeneity",
            "p_value": _sig(p_value),
            "statistic": _round(statistic, 3),
            "dof": dof,
            "effect": {"js_divergence": _round(divergence, 4),
                       "top_label": top, "top_share": _round(mine[top] / n1 if top is not None else None, 4),
                       "stable_top_label": stable_top,
                       "stable_top_share": _round(theirs[stable_top] / n0 if stable_top is not None else None, 4)},
            "samples": {"candidate": n1, "stable": n0},
            "floors": {"alpha": alpha, "max_divergence": policy.max_label_divergence, "min_labels": policy.min_labels},
        }  # fmt: skip
        reason = None
        if n1 < policy.min_labels or n0 < policy.min_labels or divergence is None:
            evidence["outcome"] = "not_judged"
        elif divergence > policy.max_label_divergence and p_value < alpha:
            evidence["outcome"] = "fail"
            reason = (
                f"output '{output}' shifted: Jensen-Shannon divergence {divergence:.3f} bits over "
                f"{policy.max_label_divergence:g} (top label {top} on {mine[top] / n1:.1%} of predictions, "
                f"stable: {stable_top} on {theirs[stable_top] / n0:.1%}; chi-square p = {p_value:.2g})"
            )
        else:
            evidence["outcome"] = "pass"
        results.append((evidence, reason))
    return results


def analyse(
    candidate: SlotAggregate,
    stable: SlotAggregate | None,
    policy: AnalysisPolicy,
    agreement: tuple[int, int] | None = None,
    alpha: float | None = None,
    share: float | None = None,
) -> Analysis:
    """Judge a step: fail on evidence of a difference that matters, inconclusive on too little data, else pass.

    `agreement` is (agreeing, compared) shadow outputs, when the rollout shadows. `alpha` overrides
    the policy's (a stricter one for a look before the step's end); `share` is the candidate's traffic
    percentage at this step (0: a shadow step; None: unknown, judged as matched). Errors are server errors only:
    requests the model refused for their own input (400s) are shown, never judged, so no client can
    fail a rollout, or trigger a rollback, by sending bad input.
    """
    alpha = policy.alpha if alpha is None else alpha
    stable = stable if stable is not None else SlotAggregate()
    seconds = 1.0  # rates below are ratios of counts; seconds only matter for throughput
    figures: dict[str, float | None] = {
        "requests": float(candidate.requests),
        "error_rate": candidate.value("error_rate", seconds),
        "client_error_rate": candidate.value("client_error_rate", seconds),
        "timeout_rate": candidate.value("timeout_rate", seconds),
        "p99_ms": candidate.value("p99", seconds),
        "stable_requests": float(stable.requests) if stable.requests else None,
        "stable_error_rate": stable.value("error_rate", seconds),
        "stable_p99_ms": stable.value("p99", seconds),
    }
    evidence: list[dict[str, Any]] = []
    failures: list[str] = []
    unsure: list[str] = []
    n1, n0 = _judged(candidate), _judged(stable)
    for name, k1, k0, ceiling, floor in (
        ("error rate", candidate.errors, stable.errors, policy.max_error_rate, policy.max_error_rate_increase),
        ("timeout rate", candidate.timeouts, stable.timeouts, policy.max_timeout_rate, policy.max_timeout_rate_increase),
    ):  # fmt: skip
        found, reason = _proportion_check(name, k1, n1, k0, n0, ceiling, floor, alpha)
        evidence.append(found)
        failures += [reason] if reason else []
    found, reason = _slo_check(candidate, policy, alpha)
    evidence.append(found)
    failures += [reason] if reason else []
    if stable.compute or candidate.compute:
        found, reason, why_not = _latency_check(candidate, stable, policy, alpha, share)
        evidence.append(found)
        failures += [reason] if reason else []
        unsure += [why_not] if why_not else []
        figures["compute_ratio"] = found["effect"]["ratio"]
        figures["compute_p_value"] = found["p_value"]
    for found, reason in _label_checks(candidate, stable, policy, alpha):
        evidence.append(found)
        failures += [reason] if reason else []
        figures[f"{found['check']}_divergence"] = found["effect"]["js_divergence"]
    if agreement is not None:
        agreeing, compared = agreement
        figures["agreement"] = agreeing / compared if compared else None
        figures["compared"] = float(compared)
        share = figures["agreement"]
        evidence.append({
            "check": "shadow", "test": "share of mirrored requests whose outputs matched the live version's",
            "effect": {"agreement": _round(share)}, "samples": {"compared": compared},
            "floors": {"min_agreement": policy.min_agreement},
            "outcome": "fail" if share is not None and share < policy.min_agreement else "pass",
        })  # fmt: skip
        if share is not None and share < policy.min_agreement:
            failures.append(f"shadow outputs agree {share:.2%}, under {policy.min_agreement:.2%}")
    if failures:
        return Analysis(Verdict.FAIL, failures, figures, evidence)
    if candidate.requests < policy.min_requests:
        why = (
            f"only {candidate.requests} requests reached the candidate; {policy.min_requests} are needed for a verdict"
        )
        return Analysis(Verdict.INCONCLUSIVE, [why], figures, evidence)
    if unsure:
        return Analysis(Verdict.INCONCLUSIVE, unsure, figures, evidence)
    return Analysis(Verdict.PASS, ["no check found a difference that matters"], figures, evidence)
