"""A runbook script's output reaches its watchers while it runs, not only when it ends."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from controlplane.runbooks.process import ScriptProcess

SCRIPT = """
import json, os, sys, time
print("first line", flush=True)
print(json.dumps({"step": "wait", "status": "ok", "detail": "waiting for the marker"}), flush=True)
marker = sys.argv[1]
while not os.path.exists(marker):  # the script's own wait: the test lets it go on by creating the file
    time.sleep(0.01)
print("last line", flush=True)
"""


def test_output_and_steps_are_reported_while_the_script_still_runs(tmp_path: Path) -> None:
    script, marker = tmp_path / "slow.py", tmp_path / "go-on"
    script.write_text(SCRIPT)
    reports: list[tuple[str, dict | None]] = []
    step_seen = threading.Event()

    def progress(output: str, step: dict | None) -> None:
        reports.append((output, step))
        if step is not None:
            step_seen.set()

    process = ScriptProcess([sys.executable, str(script), str(marker)], {}, tmp_path, 30, on_progress=progress)
    process.start()
    outcomes: list = []
    runner = threading.Thread(target=lambda: outcomes.append(process.run()))
    runner.start()
    try:
        assert step_seen.wait(20), "no progress while the script ran"
        output, step = next(r for r in reports if r[1] is not None)
        assert "first line" in output and "last line" not in output
        assert step["step"] == "wait" and step["status"] == "ok"
    finally:
        marker.touch()
        runner.join(30)
    (outcome,) = outcomes
    assert outcome.exit_code == 0 and "last line" in outcome.output
    assert [s["step"] for s in outcome.steps] == ["wait"]
