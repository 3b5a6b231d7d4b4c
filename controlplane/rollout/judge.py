"""The canary judge's statistics: pure functions over mergeable histograms and counts.

No Flask, no database: `rollout.analysis` feeds these the two slots' aggregates over a step's
window and turns what they return into a verdict with its evidence.

- Latency: a stratified Mann-Whitney U test (van Elteren) of batch compute time, one stratum per
  batch size, computed exactly from bucket counts with the tie correction (every observation in one
  histogram bucket is a tie). Matching batch sizes is what makes a canary with a 10 % share
  comparable with the stable slot: it runs fewer and smaller batches, whose requests also wait a
  different time in the queue, so request latency of the two slots differs by traffic share alone.
  The compute time of a batch of n samples is the model's own cost, whatever the share.
- Errors and timeouts: Fisher's exact test of two proportions (one-sided: the candidate worse),
  and a Wilson score bound for an absolute ceiling.
- Answers: the Jensen-Shannon divergence between the two slots' predicted-label distributions,
  with a chi-square test of homogeneity so a shift of a small sample is not mistaken for one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from serving.histogram import GROWTH, Histogram, lower_edge


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def normal_isf(p: float) -> float:
    """The z with P(Z > z) = p (bisection on `normal_sf`; p in (0, 1))."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if normal_sf(mid) > p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class RankTest:
    """What a (stratified) Mann-Whitney test found: candidate against baseline."""

    u: float  # pairs where the candidate was slower, ties counting a half (summed over strata)
    pairs: float  # candidate x baseline pairs compared (summed over strata)
    z: float
    p_value: float  # one-sided: the candidate is slower
    strata: int  # strata with both sides present

    @property
    def superiority(self) -> float | None:
        """P(a candidate observation > a baseline one) + half the ties: 0.5 means no difference."""
        return self.u / self.pairs if self.pairs else None


def _rank_stratum(candidate: Histogram, baseline: Histogram) -> tuple[float, float, float, float] | None:
    """Return (U, E[U], Var[U] with ties, N) for one stratum, or None if a side is empty."""
    m, n = candidate.total, baseline.total
    if m == 0 or n == 0:
        return None
    big_n = m + n
    below = 0  # baseline observations in lower buckets
    u = 0.0
    ties = 0.0
    for index in sorted(set(candidate.counts) | set(baseline.counts)):
        a, b = candidate.counts.get(index, 0), baseline.counts.get(index, 0)
        u += a * (below + b / 2)
        t = a + b
        ties += t**3 - t
        below += b
    mean = m * n / 2
    var = m * n / 12 * ((big_n + 1) - ties / (big_n * (big_n - 1))) if big_n > 1 else 0.0
    return u, mean, var, big_n


def rank_test(strata: Mapping[object, tuple[Histogram, Histogram]]) -> RankTest:
    """van Elteren's stratified Mann-Whitney test; one stratum is the plain Mann-Whitney U test.

    Each stratum's U is weighted by 1/(N_s + 1), as van Elteren proposed: locally most powerful
    when the shift is the same in every stratum, and no stratum's size swamps the others.
    """
    t = e = v = 0.0
    u_total = pairs = 0.0
    used = 0
    for candidate, baseline in strata.values():
        found = _rank_stratum(candidate, baseline)
        if found is None:
            continue
        u, mean, var, big_n = found
        w = 1 / (big_n + 1)
        t, e, v = t + w * u, e + w * mean, v + w * w * var
        u_total += u
        pairs += candidate.total * baseline.total
        used += 1
    if v <= 0:
        return RankTest(u_total, pairs, 0.0, 1.0, used)
    z = (t - e) / math.sqrt(v)
    return RankTest(u_total, pairs, z, normal_sf(z), used)


def median_ms(h: Histogram) -> float | None:
    q = h.quantile(0.5)
    return None if q is None else q * 1000


@dataclass(frozen=True)
class Shift:
    """How much slower the candidate is at matching batch sizes, weighted by its samples."""

    candidate_ms: float  # weighted median batch compute time
    baseline_ms: float
    samples: int  # candidate samples in strata that both sides ran

    @property
    def difference_ms(self) -> float:
        return self.candidate_ms - self.baseline_ms

    @property
    def ratio(self) -> float | None:
        return self.candidate_ms / self.baseline_ms if self.baseline_ms > 0 else None


def shift(strata: Mapping[int, tuple[Histogram, Histogram]]) -> Shift | None:
    """Weighted medians of batch compute time over the batch sizes both sides ran; None if none.

    A stratum's weight is the candidate's samples in it, so the shift is what a candidate request
    pays, on average, against the same batch run by the baseline.
    """
    c_sum = b_sum = 0.0
    weight = 0
    for size, (candidate, baseline) in strata.items():
        cm, bm = median_ms(candidate), median_ms(baseline)
        if cm is None or bm is None:
            continue
        w = candidate.total * int(size)
        c_sum, b_sum, weight = c_sum + w * cm, b_sum + w * bm, weight + w
    if weight == 0:
        return None
    return Shift(c_sum / weight, b_sum / weight, weight)


def fisher_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided Fisher exact test: P(the candidate has >= k1 of the k1 + k0 events | margins).

    H1: the candidate's proportion k1/n1 is greater than the baseline's k0/n0. Summed in log space
    over the hypergeometric tail (at most k1 + k0 terms).
    """
    if n1 <= 0 or k1 <= 0:
        return 1.0
    k, n = k1 + k0, n1 + n0
    if k == 0:
        return 1.0

    def log_comb(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    base = log_comb(n, k)
    top = min(k, n1)
    total = 0.0
    for x in range(k1, top + 1):
        if k - x > n0:
            continue
        total += math.exp(log_comb(n1, x) + log_comb(n0, k - x) - base)
    return min(1.0, total)


def wilson_bounds(k: int, n: int, z: float) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion k/n at normal quantile z; None when n == 0."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def share_above(h: Histogram, seconds: float) -> int:
    """How many observations of `h` lie in buckets wholly above `seconds` (a conservative count)."""
    return sum(c for i, c in h.counts.items() if lower_edge(i) >= seconds)


def share_at_or_above(h: Histogram, seconds: float) -> int:
    """How many observations of `h` lie in buckets that reach above `seconds` (a generous count)."""
    return sum(c for i, c in h.counts.items() if lower_edge(i) * GROWTH > seconds)


# -- answers ---------------------------------------------------------------------------------


def js_divergence(p: Mapping[str, int], q: Mapping[str, int]) -> float | None:
    """Jensen-Shannon divergence (bits, 0..1) between two label count distributions; None if one is empty."""
    sp, sq = sum(p.values()), sum(q.values())
    if sp == 0 or sq == 0:
        return None
    total = 0.0
    for label in set(p) | set(q):
        a, b = p.get(label, 0) / sp, q.get(label, 0) / sq
        m = (a + b) / 2
        if a:
            total += 0.5 * a * math.log2(a / m)
        if b:
            total += 0.5 * b * math.log2(b / m)
    return max(0.0, total)


def _gamma_q(a: float, x: float) -> float:
    """The regularised upper incomplete gamma function Q(a, x) (series / continued fraction)."""
    if x <= 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - gln))
    b = x + 1 - a  # Lentz's continued fraction for Q
    c = 1 / 1e-300
    d = 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(-x + a * math.log(x) - gln) * h)


def chi2_sf(statistic: float, dof: int) -> float:
    """P(chi-square with `dof` degrees of freedom > statistic)."""
    if dof <= 0:
        return 1.0
    return _gamma_q(dof / 2, statistic / 2)


def chi2_homogeneity(p: Mapping[str, int], q: Mapping[str, int]) -> tuple[float, int, float]:
    """Pearson's chi-square test that two label count distributions are the same: (statistic, dof, p-value)."""
    labels = sorted(set(p) | set(q))
    sp, sq = sum(p.values()), sum(q.values())
    n = sp + sq
    if sp == 0 or sq == 0 or len(labels) < 2:
        return 0.0, 0, 1.0
    statistic = 0.0
    for label in labels:
        column = p.get(label, 0) + q.get(label, 0)
        for observed, row in ((p.get(label, 0), sp), (q.get(label, 0), sq)):
            expected = row * column / n
            if expected > 0:
                statistic += (observed - expected) ** 2 / expected
    dof = len(labels) - 1
    return statistic, dof, chi2_sf(statistic, dof)
