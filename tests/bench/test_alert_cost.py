"""bench.alert_cost runs end to end on a tiny history and prints one line per history length."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_prints_the_cost_of_each_history_length() -> None:
    argv = [sys.executable, "-m", "bench.alert_cost", "--hours", "0,0.1", "--evaluations", "2", "--requests", "5"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = re.findall(r"([\d.]+) h of history: first evaluation +([\d.]+) ms, then +([\d.]+) ms", done.stdout)
    assert [hours for hours, _, _ in lines] == ["0", "0.1"], done.stdout
    assert all(float(first) > 0 and float(then) > 0 for _, first, then in lines)
