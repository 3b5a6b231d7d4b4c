"""The canary judge on recorded outcomes: pure functions over histograms and counts, seeded, fast.

The cases marked "old rule" are ones the p99-ratio rule this judge replaced got wrong: it failed an
equal version whose p99 was noisy (or on one error in a dozen requests), and passed a version 2.5x
slower per sample whose p99 the stable slot's own queueing hid.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from controlplane.history.query import SlotAggregate
from controlplane.rollout import judge
from controlplane.rollout.analysis import AnalysisPolicy, analyse
from controlplane.rollout.states import Verdict
from serving.histogram import Histogram

POLICY = AnalysisPolicy(min_requests=100)
LABELS = [str(i) for i in range(10)]
STABLE_MIX = np.array([0.16, 0.12, 0.11, 0.1, 0.1, 0.1, 0.09, 0.08, 0.08, 0.06])


def recorded(
    requests: int,
    *,
    sizes: dict[int, float],
    seed: int,
    cost_ms: float = 0.05,
    slowdown: float = 1.0,
    queue_ms: float = 0.0,
    tail: float = 0.25,
    errors: int = 0,
    timeouts: int = 0,
    labels: np.ndarray | None = STABLE_MIX,
) -> SlotAggregate:
    """A slot's aggregate as the sampler records it: requests spread over batch sizes (share of requests).

    A batch of n costs `cost_ms` x (2 + n) x `slowdown` (a fixed overhead plus a per-sample cost),
    with lognormal noise; a request's latency is its batch's compute time plus a queue wait whose
    tail (`tail`, lognormal sigma) is what makes two p99s of equal versions differ.
    """
    rng = np.random.default_rng(seed)
    agg = SlotAggregate()
    ran = requests - errors - timeouts
    for size, share in sizes.items():
        batches = max(1, round(ran * share / size))
        compute = rng.lognormal(np.log(cost_ms * (2 + size) * slowdown / 1000), 0.12, batches)
        hist = agg.compute.setdefault(size, Histogram())
        for seconds in compute:
            hist.record(float(seconds))
        waits = rng.lognormal(np.log(max(queue_ms, 1e-6) / 1000), tail, batches * size) if queue_ms else 0.0
        for seconds in np.repeat(compute, size) + waits:
            agg.latency.record(float(seconds))
    agg.successes, agg.errors, agg.timeouts = ran, errors, timeouts
    if labels is not None:
        drawn = rng.choice(len(labels), size=ran, p=labels / labels.sum())
        agg.labels = {"probabilities": {LABELS[i]: int(c) for i, c in enumerate(np.bincount(drawn, minlength=10)) if c}}
    return agg


CANARY_SIZES = {1: 0.7, 2: 0.3}  # a 10 % share: few requests wait together, so batches are small
STABLE_SIZES = {1: 0.1, 2: 0.15, 4: 0.25, 8: 0.5}  # the other 90 %: larger batches, longer queues


def old_rule_fails(candidate: SlotAggregate, stable: SlotAggregate) -> bool:
    """The rule this judge replaced: canary p99 over 1.5 x stable p99, or any rate over 1 % after 10 requests."""
    p99, stable_p99 = candidate.value("p99", 1), stable.value("p99", 1)
    rates = [candidate.value("error_rate", 1) or 0, candidate.value("timeout_rate", 1) or 0]
    breached = p99 > 1.5 * stable_p99 or any(r > 0.01 for r in rates)
    return breached and candidate.requests >= 10


def test_equal_versions_at_a_small_share_pass_though_their_p99s_differ() -> None:
    # Old rule: the canary's p99 is 1.5-2x the stable's by its queue tail alone, and it rolled back.
    for seed in range(20):
        canary = recorded(3000, sizes=CANARY_SIZES, seed=seed, queue_ms=0.3, tail=0.9)
        stable = recorded(27000, sizes=STABLE_SIZES, seed=1000 + seed, queue_ms=0.3, tail=0.3)
        result = analyse(canary, stable, POLICY)
        assert result.verdict is Verdict.PASS, (seed, result.reasons)
    assert old_rule_fails(canary, stable)
    latency = next(e for e in result.evidence if e["check"] == "latency")
    assert latency["samples"]["batch_sizes"] == [1, 2] and 0.8 < latency["effect"]["ratio"] < 1.25


def test_a_version_2_5x_slower_per_sample_is_caught_though_its_p99_is_not_higher() -> None:
    canary = recorded(3000, sizes=CANARY_SIZES, seed=1, slowdown=2.5, queue_ms=0.1)
    stable = recorded(27000, sizes=STABLE_SIZES, seed=2, queue_ms=2.0)  # its queue hides the difference
    assert not old_rule_fails(canary, stable)
    result = analyse(canary, stable, POLICY, share=50)
    assert result.verdict is Verdict.FAIL
    assert "compute time" in result.reasons[0] and "at the same batch sizes" in result.reasons[0]
    latency = next(e for e in result.evidence if e["check"] == "latency")
    assert latency["outcome"] == "fail" and latency["p_value"] < 1e-9
    assert 2.2 < latency["effect"]["ratio"] < 2.8 and latency["effect"]["superiority"] > 0.95
    assert latency["floors"]["min_difference_ms"] == POLICY.latency_floor


def test_at_a_small_share_only_a_gross_slowdown_fails_since_a_rarely_used_slot_runs_cold() -> None:
    stable = recorded(27000, sizes=STABLE_SIZES, seed=30)
    cold = recorded(3000, sizes=CANARY_SIZES, seed=31, slowdown=1.7)  # what the lab measured for an equal version
    at_ten = analyse(cold, stable, POLICY, share=10)
    latency = next(e for e in at_ten.evidence if e["check"] == "latency")
    assert at_ten.verdict is Verdict.PASS and latency["p_value"] < 1e-9  # significant, but not like with like
    assert latency["floors"]["shares_matched"] is False and latency["floors"]["max_slowdown"] == 3.0
    assert analyse(cold, stable, POLICY, share=50).verdict is Verdict.FAIL  # at equal shares it would be
    gross = recorded(3000, sizes=CANARY_SIZES, seed=32, slowdown=4.0)
    assert analyse(gross, stable, POLICY, share=10).verdict is Verdict.FAIL
    assert analyse(cold, stable, POLICY, share=0).verdict is Verdict.FAIL  # a shadow step mirrors all traffic


def test_a_shift_under_the_practical_floors_never_fails() -> None:
    # 10 % slower, on thousands of batches: significant, and too small to matter (under max_slowdown).
    canary = recorded(20000, sizes=CANARY_SIZES, seed=3, slowdown=1.1)
    stable = recorded(60000, sizes=STABLE_SIZES, seed=4)
    result = analyse(canary, stable, POLICY)
    latency = next(e for e in result.evidence if e["check"] == "latency")
    assert latency["p_value"] < POLICY.alpha and result.verdict is Verdict.PASS
    # 2x slower but by microseconds, under an absolute floor of 1 ms: never fails either.
    slow = recorded(20000, sizes=CANARY_SIZES, seed=5, slowdown=2.0)
    assert analyse(slow, stable, AnalysisPolicy(latency_floor_ms=1.0)).verdict is Verdict.PASS
    assert analyse(slow, stable, POLICY).verdict is Verdict.FAIL


def test_two_percent_server_errors_are_caught_with_their_evidence() -> None:
    canary = recorded(2500, sizes=CANARY_SIZES, seed=6, errors=50)
    stable = recorded(22500, sizes=STABLE_SIZES, seed=7, errors=4)
    result = analyse(canary, stable, POLICY)
    assert result.verdict is Verdict.FAIL
    errors = next(e for e in result.evidence if e["check"] == "error rate")
    assert errors["outcome"] == "fail" and errors["interval"][0] > 0.01
    assert errors["samples"] == {"candidate": 2500, "stable": 22500, "candidate_events": 50, "stable_events": 4}
    # Under the 1 % ceiling, 0.8 % against the stable's 0.02 % is still a significant rise over the 0.5 % floor.
    rise = analyse(recorded(10000, sizes=CANARY_SIZES, seed=8, errors=80), stable, POLICY)
    assert rise.verdict is Verdict.FAIL and "exceeds the stable version's" in rise.reasons[0]


@pytest.mark.parametrize("kind", ["errors", "timeouts"])
def test_one_failure_in_a_dozen_requests_is_not_a_rollback(kind: str) -> None:
    # Old rule: 1 of 12 is 8 % > 1 %, and ten requests were enough to fail.
    canary = recorded(12, sizes={1: 1.0}, seed=9, labels=None, **{kind: 1})
    stable = recorded(5000, sizes=STABLE_SIZES, seed=10, **{kind: 2})
    assert old_rule_fails(canary, stable)
    result = analyse(canary, stable, POLICY)
    assert result.verdict is Verdict.INCONCLUSIVE and "only 12 requests" in result.reasons[0]


def test_every_request_failing_needs_no_minimum() -> None:
    canary = recorded(10, sizes={1: 1.0}, seed=11, errors=10, labels=None)
    assert analyse(canary, recorded(5000, sizes=STABLE_SIZES, seed=12), POLICY).verdict is Verdict.FAIL


def test_answers_collapsing_to_one_class_fail_naming_the_output_and_the_shift() -> None:
    collapsed = np.array([0.996] + [0.004 / 9] * 9)
    canary = recorded(3000, sizes=CANARY_SIZES, seed=13, labels=collapsed)
    result = analyse(canary, recorded(27000, sizes=STABLE_SIZES, seed=14), POLICY)
    assert result.verdict is Verdict.FAIL
    assert "output 'probabilities' shifted" in result.reasons[0] and "top label 0 on 99." in result.reasons[0]
    # A retrained version that agrees on 97 % of inputs moves the mix a little: it passes.
    drift = STABLE_MIX * 0.97 + np.roll(STABLE_MIX, 1) * 0.03
    ok = analyse(
        recorded(3000, sizes=CANARY_SIZES, seed=15, labels=drift), recorded(27000, sizes=STABLE_SIZES, seed=16), POLICY
    )
    assert ok.verdict is Verdict.PASS, ok.reasons


def test_too_little_data_is_inconclusive_never_a_pass() -> None:
    assert (
        analyse(recorded(40, sizes={1: 1.0}, seed=17), recorded(5000, sizes=STABLE_SIZES, seed=18), POLICY).verdict
        is Verdict.INCONCLUSIVE
    )
    assert analyse(SlotAggregate(), None, POLICY).verdict is Verdict.INCONCLUSIVE
    # Enough requests, but no batch size both slots ran: compute time cannot be compared like with like.
    lonely = analyse(recorded(3000, sizes={16: 1.0}, seed=19), recorded(27000, sizes={1: 1.0}, seed=20), POLICY)
    assert lonely.verdict is Verdict.INCONCLUSIVE and "batch sizes the stable version also ran" in lonely.reasons[0]


def test_client_errors_never_fail_a_canary() -> None:
    canary = recorded(1000, sizes=CANARY_SIZES, seed=21)
    canary.client_errors = 400  # a client sending bad input gets 400s
    result = analyse(canary, recorded(9000, sizes=STABLE_SIZES, seed=22), POLICY)
    assert result.verdict is Verdict.PASS, result.reasons


def test_over_the_slo_fails_and_shadow_disagreement_fails() -> None:
    slow = recorded(500, sizes={1: 1.0}, seed=23, cost_ms=700)
    result = analyse(slow, recorded(5000, sizes={1: 1.0}, seed=24, cost_ms=700), POLICY)
    assert result.verdict is Verdict.FAIL and "over the SLO of 1000 ms" in result.reasons[0]
    shadow = analyse(
        recorded(500, sizes={1: 1.0}, seed=25), recorded(5000, sizes={1: 1.0}, seed=26), POLICY, (850, 1000)
    )
    assert shadow.verdict is Verdict.FAIL and "agree 85.00%" in shadow.reasons[0]


def test_policies_refuse_unknown_and_retired_settings_but_read_stored_ones() -> None:
    with pytest.raises(ValueError, match="unknown analysis setting"):
        AnalysisPolicy.from_dict({"max_errors": 1})
    with pytest.raises(ValueError, match="max_p99_ratio' was retired"):
        AnalysisPolicy.from_dict({"max_p99_ratio": 1.5})
    assert AnalysisPolicy.from_dict({"max_p99_ratio": 1.5, "min_requests": 7}, stored=True).min_requests == 7
    assert AnalysisPolicy.from_dict({"min_requests": "20"}).min_requests == 20


# -- the statistics themselves, against values worked by hand or by brute force -----------------


def test_mann_whitney_from_buckets_matches_the_pairwise_count_with_ties() -> None:
    rng = np.random.default_rng(27)
    a, b = rng.integers(0, 6, 40), rng.integers(1, 7, 55)  # bucket indices: many ties
    u = sum((x > y) + 0.5 * (x == y) for x, y in itertools.product(a, b))
    test = judge.rank_test(
        {
            1: (
                Histogram(dict(zip(*np.unique(a, return_counts=True)))),
                Histogram(dict(zip(*np.unique(b, return_counts=True)))),
            )
        }
    )
    assert test.u == pytest.approx(u) and test.pairs == 40 * 55
    # Tie-corrected variance: all observations in one bucket give no evidence at all.
    flat = judge.rank_test({1: (Histogram({5: 30}), Histogram({5: 70}))})
    assert flat.p_value == 1.0 and flat.superiority == 0.5


def test_exact_and_asymptotic_tails() -> None:
    assert judge.fisher_greater(3, 4, 1, 4) == pytest.approx(0.242857, abs=1e-6)  # [[3,1],[1,3]], one-sided
    assert judge.chi2_sf(10.0, 3) == pytest.approx(0.0185661, rel=1e-5)
    assert judge.chi2_sf(2.0, 9) == pytest.approx(0.991468, rel=1e-5)
    z = judge.normal_isf(0.001)
    low, high = judge.wilson_bounds(10, 10, z)
    assert low == pytest.approx(10 / (10 + z * z)) and high == pytest.approx(
        1.0
    )  # all of n: the bound is n / (n + z^2)
    assert judge.normal_isf(0.001) == pytest.approx(3.0902, abs=1e-4)
    assert judge.js_divergence({"a": 5}, {"b": 5}) == pytest.approx(1.0)
    assert judge.js_divergence({"a": 5, "b": 5}, {"a": 1, "b": 1}) == pytest.approx(0.0)
