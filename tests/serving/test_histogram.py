"""The mergeable histogram: percentile accuracy against numpy, merging, deltas, serialisation."""

from __future__ import annotations

import numpy as np
import pytest

from serving.histogram import BUCKETS, GROWTH, Histogram, bucket_of, lower_edge

# Half a bucket each way is the worst case for a geometric interpolation within one bucket.
TOLERANCE = GROWTH - 1


def filled(values) -> Histogram:
    h = Histogram()
    for v in values:
        h.record(float(v))
    return h


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).lognormal(np.log(0.01), 0.8, 50_000),  # typical latency shape
        np.random.default_rng(1).uniform(0.001, 0.2, 50_000),
        np.concatenate([np.full(9_900, 0.004), np.full(100, 1.5)]),  # a bimodal tail
    ],
    ids=["lognormal", "uniform", "bimodal"],
)
def test_percentiles_are_within_one_bucket_of_numpy(values: np.ndarray) -> None:
    h = filled(values)
    assert h.total == len(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = np.quantile(values, q, method="inverted_cdf")  # the sample at that rank, no blending
        assert abs(h.quantile(q) / exact - 1) <= TOLERANCE, (q, h.quantile(q), exact)


def test_merging_equals_recording_everything_in_one() -> None:
    rng = np.random.default_rng(2)
    parts = [rng.lognormal(np.log(0.02), 1.0, 5_000) for _ in range(6)]
    merged = Histogram.merged(filled(p) for p in parts)
    together = filled(np.concatenate(parts))
    assert merged.counts == together.counts
    # Averaging per-part p99s is what merged buckets avoid: it differs from the true p99.
    assert merged.quantile(0.99) == together.quantile(0.99)


def test_minus_gives_what_was_added_since_a_snapshot() -> None:
    h = filled([0.001, 0.002, 0.5])
    before = h.copy()
    h.record(0.002, 3)
    h.record(7.0)
    delta = h.minus(before)
    assert delta.total == 4
    assert delta.counts == {bucket_of(0.002): 3, bucket_of(7.0): 1}


def test_round_trip_through_json_keys() -> None:
    h = filled([0.0001, 0.01, 0.01, 3.0])
    assert Histogram.from_dict(h.to_dict()).counts == h.counts
    assert all(isinstance(k, str) for k in h.to_dict())


def test_edges_and_out_of_range_values() -> None:
    assert bucket_of(0.0) == 0 and bucket_of(-1.0) == 0
    assert bucket_of(10_000.0) == BUCKETS - 1
    assert lower_edge(1) < lower_edge(2) and lower_edge(2) / lower_edge(1) == pytest.approx(GROWTH)
    for value in (0.00003, 0.5, 42.0):
        i = bucket_of(value)
        assert lower_edge(i) <= value < lower_edge(i + 1)
    assert Histogram().quantile(0.5) is None
    with pytest.raises(ValueError):
        Histogram().quantile(1.5)
