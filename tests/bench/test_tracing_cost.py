"""The tracing benchmark runs every configuration in its own process, on the code it says it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # five fresh processes, each loading ONNX Runtime and the demo mlp
def test_one_run_prints_every_configuration_and_its_ratio(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.tracing_cost", "--calls", "100", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    ).stdout
    rows = {line[:16].strip(): line[16:].split() for line in out.splitlines() if line[:16].strip() in
            ("no tracing code", "off", "1 %", "100 %")}  # fmt: skip
    # NOTE: a checkout without the history before tracing (a shallow clone) measures against 'off'.
    baseline = "off" if "no git history here" in out else "no tracing code"
    assert list(rows) == ["no tracing code", "off", "1 %", "100 %"][baseline == "off" :]
    assert rows[baseline][2:] == ["1.000", "1.000"]  # the reference of the ratios
    for wall, cpu, wall_ratio, cpu_ratio in rows.values():
        assert float(wall) > 0 and float(cpu) > 0 and float(wall_ratio) > 0 and float(cpu_ratio) > 0
