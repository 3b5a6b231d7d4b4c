"""The batch-limit benchmark runs both engines on a real model and prints the pair's ratios."""

from __future__ import annotations

import re

from bench.batchlimit import main


def test_both_engines_run_alternating_windows_and_the_ratios_are_printed(capsys) -> None:
    assert main(["--model", "mlp", "--concurrency", "4", "--windows", "2", "--seconds", "0.2", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "limited: batch limits {0: 2}" in out
    rows = dict(re.findall(r"^(max|limited)\s+([\d.]+)", out, re.MULTILINE))
    assert set(rows) == {"max", "limited"} and all(float(rps) > 0 for rps in rows.values())
    assert re.search(r"limited / max: req/s x[\d.]+ +p50 x[\d.]+ +p99 x[\d.]+", out)
    assert "per adjacent pair of windows, p99: median x" in out and "2 pairs" in out
