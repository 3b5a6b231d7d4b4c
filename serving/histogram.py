"""A mergeable latency histogram with fixed log-spaced buckets.

Every histogram shares the same bucket edges, so histograms from different processes, slots and
time intervals merge by adding counts, and percentiles over any range come from the merged
counts, never from averaging percentiles. Edges grow by 2**(1/8) (about 9%) from 10 us to
~100 s, so a percentile is off by at most half a bucket: under 4.5% relative.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

MIN_SECONDS = 1e-5
GROWTH = 2 ** (1 / 8)
BUCKETS = 186  # MIN_SECONDS * GROWTH**185 is about 100 s; the last bucket also takes anything above
_LOG_GROWTH = math.log(GROWTH)


def bucket_of(seconds: float) -> int:
    """Return the index of the bucket holding `seconds` (bucket i spans [edge(i), edge(i+1)))."""
    if seconds <= MIN_SECONDS:
        return 0
    return min(BUCKETS - 1, int(math.log(seconds / MIN_SECONDS) / _LOG_GROWTH))


def lower_edge(index: int) -> float:
    """Return the lower edge of bucket `index` in seconds."""
    return 0.0 if index == 0 else MIN_SECONDS * GROWTH**index


class Histogram:
    """Counts per bucket, kept sparse (most requests land in a handful of buckets)."""

    __slots__ = ("counts",)

    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self.counts: dict[int, int] = {int(k): int(v) for k, v in (counts or {}).items() if v}

    def record(self, seconds: float, count: int = 1) -> None:
        """Add `count` observations of `seconds`."""
        index = bucket_of(seconds)
        self.counts[index] = self.counts.get(index, 0) + count

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: Histogram) -> Histogram:
        """Add another histogram's counts into this one; return self."""
        for index, count in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + count
        return self

    def minus(self, earlier: Histogram) -> Histogram:
        """Return the counts added since `earlier` (a snapshot of this same cumulative histogram)."""
        return Histogram({i: c - earlier.counts.get(i, 0) for i, c in self.counts.items()})

    def copy(self) -> Histogram:
        return Histogram(self.counts)

    def quantile(self, q: float) -> float | None:
        """Estimate the q-quantile (0..1) in seconds, interpolating within the bucket; None when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be between 0 and 1")
        total = self.total
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for index in sorted(self.counts):
            count = self.counts[index]
            if seen + count >= rank:
                low = lower_edge(index) or MIN_SECONDS / GROWTH
                fraction = (rank - seen) / count
                # Geometric interpolation: latencies spread evenly on a log scale within a bucket.
                return low * GROWTH**fraction
            seen += count
        return lower_edge(max(self.counts)) * GROWTH

    def to_dict(self) -> dict[str, int]:
        """Return the sparse counts with string keys, for JSON columns."""
        return {str(i): c for i, c in sorted(self.counts.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, int] | None) -> Histogram:
        return cls({int(k): v for k, v in (data or {}).items()})

    @classmethod
    def merged(cls, histograms: Iterable[Histogram]) -> Histogram:
        """Return the sum of several histograms."""
        result = cls()
        for h in histograms:
            result.merge(h)
        return result
