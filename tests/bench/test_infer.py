"""The engine's per-call micro-benchmark runs on a real model and reports both paths."""

from __future__ import annotations

from pathlib import Path

from bench.infer import measure


def test_measure_times_a_bare_run_and_engine_infer_on_the_demo_mlp(demo_store: Path) -> None:
    results = measure(demo_store / "mlp" / "1", calls=50)
    assert set(results) == {"session.run", "Engine.infer"}
    for wall_us, cpu_us in results.values():
        assert 0 < wall_us < 1e6 and 0 <= cpu_us < 1e6
