"""The public-model benchmark runs every pinned model batched and unbatched and reports the ratio."""

from __future__ import annotations

import math

import pytest

from bench.public import SUBJECTS, run

pytestmark = pytest.mark.slow


def test_every_public_model_is_measured_both_ways_without_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rows, ratios = run(warmup_s=0.2, seconds=0.5)
    assert set(ratios) == {s.name for s in SUBJECTS}, "a pinned wheel is missing: run `make install`"
    assert all(math.isfinite(r) and r > 0 for r in ratios.values()), ratios
    assert len(rows) == 2 * len(SUBJECTS)
    assert all(row.requests >= 1 and row.errors == 0 for row in rows), [(r.label, r.statuses) for r in rows]
    # Silero VAD declares max_batch_size 0: even with batching on, each request ran alone.
    assert next(r for r in rows if r.label == "silero-vad batched").batch == 1.0
    printed = capsys.readouterr().out
    assert "magika: batched / unbatched throughput = " in printed
