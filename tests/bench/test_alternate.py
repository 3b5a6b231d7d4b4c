"""The in-server comparison switches the engine's batching limits between windows of one running server."""

from __future__ import annotations

import re

import pytest

from bench import alternate
from bench.alternate import Window, summary


def test_each_window_runs_at_its_limit_in_one_server(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    largest: list[int] = []  # after each window, the largest batch the worker has formed so far
    drive = alternate.drive

    def driven(port, path, body, concurrency, warmup, seconds, probe):
        window = drive(port, path, body, concurrency, warmup, seconds, probe)
        stats = alternate.call(port, "GET", "/v2/models/mlp/stats", "")["model_stats"][0]["batch_stats"]
        largest.append(max(entry["batch_size"] for entry in stats))
        return window

    monkeypatch.setattr(alternate, "drive", driven)
    # One worker: its statistics are the server's. Limits 1, then 8: a window at 1 forms no batch over 1.
    argv = ["--workload", "mlp", "--concurrency", "8", "--max-batch-sizes", "1,8", "--pairs", "1"]
    assert alternate.main(argv + ["--seconds", "0.5", "--settle", "0", "--env", "FLIGHTDECK_WORKERS=1"]) == 0
    assert largest[0] == 1  # the first window, at max batch 1
    assert largest[1] > 1  # then 8 concurrent callers merged
    out = capsys.readouterr().out
    assert re.search(r"^pair 0 max batch   1: +\d+ req/s", out, re.MULTILINE)
    assert re.search(r"^max batch   8: +\d+ req/s, p99 +[\d.]+ ms, errors 0; x[\d.]+ of max batch 1", out, re.MULTILINE)


def test_the_summary_pairs_each_window_with_the_first_settings_window_of_its_pair() -> None:
    windows = [
        Window(0, 2, 100.0, 50.0, 0),
        Window(0, 4, 110.0, 40.0, 0),
        Window(1, 4, 90.0, 60.0, 0),
        Window(1, 2, 100.0, 70.0, 1),
    ]
    first, second = summary(windows)
    assert first.startswith("max batch   2:     100 req/s, p99   60.0 ms, errors 1; x1.00")
    assert second.startswith("max batch   4:     100 req/s, p99   50.0 ms, errors 0; x1.00 of max batch 2")
    assert second.endswith("(pairs: 1.10 0.90)")
