"""Canary analysis verdicts on recorded outcomes: pass, fail (with why), inconclusive."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.history.query import SlotAggregate
from controlplane.rollout.analysis import AnalysisPolicy, analyse
from controlplane.rollout.states import Verdict


def recorded(n: int, *, errors: int = 0, timeouts: int = 0, median_s: float = 0.01, seed: int = 0) -> SlotAggregate:
    agg = SlotAggregate()
    for v in np.random.default_rng(seed).lognormal(np.log(median_s), 0.3, n - errors - timeouts):
        agg.latency.record(float(v))
    agg.successes, agg.errors, agg.timeouts = n - errors - timeouts, errors, timeouts
    return agg


POLICY = AnalysisPolicy(min_requests=100)


def test_a_healthy_canary_passes() -> None:
    result = analyse(recorded(500, seed=1), recorded(5000, seed=2), POLICY)
    assert result.verdict is Verdict.PASS
    assert result.figures["requests"] == 500 and result.figures["p99_ms"] > 0


@pytest.mark.parametrize(
    ("canary", "reason"),
    [
        (recorded(500, errors=25), "error rate 5.00% is over 1.00%"),
        (recorded(500, timeouts=20), "timeout rate 4.00% is over 1.00%"),
        (recorded(500, median_s=0.05), "x the stable version's"),
        (recorded(500, median_s=2.0), "over the SLO of 1000 ms"),
    ],
    ids=["errors", "timeouts", "slower-than-stable", "over-slo"],
)
def test_a_breached_threshold_fails_and_says_which(canary: SlotAggregate, reason: str) -> None:
    result = analyse(canary, recorded(5000, seed=3), POLICY)
    assert result.verdict is Verdict.FAIL
    assert any(reason in r for r in result.reasons), result.reasons


def test_client_errors_never_fail_a_canary() -> None:
    canary = recorded(1000, seed=4)
    canary.successes, canary.client_errors = 600, 400  # a client sending bad input gets 400s
    result = analyse(canary, recorded(5000, seed=5), POLICY)
    assert result.verdict is Verdict.PASS, result.reasons
    assert result.figures["error_rate"] == 0 and result.figures["client_error_rate"] == pytest.approx(0.4)


def test_an_error_rate_well_above_stable_fails_even_under_the_absolute_limit() -> None:
    policy = AnalysisPolicy(min_requests=100, max_error_rate=0.05, max_error_rate_increase=0.005)
    result = analyse(recorded(1000, errors=20), recorded(10000, errors=10), policy)
    assert result.verdict is Verdict.FAIL and "exceeds the stable version's" in result.reasons[0]


def test_too_few_requests_is_inconclusive_not_a_pass() -> None:
    result = analyse(recorded(40), recorded(5000), POLICY)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "only 40 requests" in result.reasons[0]
    assert analyse(SlotAggregate(), None, POLICY).verdict is Verdict.INCONCLUSIVE  # no data at all


def test_a_clear_failure_needs_no_minimum() -> None:
    assert analyse(recorded(20, errors=20), recorded(5000), POLICY).verdict is Verdict.FAIL


def test_shadow_agreement_below_the_floor_fails() -> None:
    result = analyse(recorded(500), recorded(5000), POLICY, agreement=(950, 1000))
    assert result.verdict is Verdict.FAIL and "agree 95.00%" in result.reasons[0]


def test_policies_refuse_unknown_settings() -> None:
    with pytest.raises(ValueError, match="unknown analysis setting"):
        AnalysisPolicy.from_dict({"max_errors": 1})
    assert AnalysisPolicy.from_dict({"min_requests": "20"}).min_requests == 20
