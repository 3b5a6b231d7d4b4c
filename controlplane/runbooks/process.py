"""One runbook script as a child process: no shell, its own process group, output captured, killed at its timeout.

No database and no Flask here: the runner passes a callback that records each step as its JSON line
arrives, and gets a `ScriptResult` at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

STEP_STATUSES = frozenset({"ok", "failed", "skipped", "dry-run"})
MAX_OUTPUT_BYTES = 64 * 1024  # what is kept of a run's stdout and stderr
MAX_LINE_BYTES = 16 * 1024
MAX_STEPS = 100
MAX_DETAIL_CHARS = 4000


@dataclass
class ScriptResult:
    """How a script ended: exit code (None if it never ran), whether it was killed, what it printed."""

    exit_code: int | None
    timed_out: bool = False
    stopped: bool = False  # killed because the server shut down
    output: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


def parse_step(line: str) -> dict[str, Any] | None:
    """Return the step record a line of output carries ({"step", "status", "detail"}), or None."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("step"), str) or data.get("status") not in STEP_STATUSES:
        return None
    detail = data.get("detail")
    shown = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    if len(shown) > MAX_DETAIL_CHARS:
        detail = shown[:MAX_DETAIL_CHARS] + " [...]"
    return {
        "step": data["step"][:64],
        "status": data["status"],
        "detail": detail,
        "at": datetime.now(UTC).isoformat(),
    }


class ScriptProcess:
    """Run one script and supervise it; `run()` blocks until it ends or is killed."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        timeout_s: float,
        on_progress: Callable[[str, dict[str, Any] | None], None] | None = None,
        progress_every_s: float = 0.5,
    ) -> None:
        self.argv, self.env, self.cwd, self.timeout_s = argv, env, cwd, timeout_s
        self._on_progress = on_progress
        self._progress_every_s = progress_every_s
        self._process: subprocess.Popen[bytes] | None = None
        self._timed_out = self._stopped = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the script (raises OSError when it cannot)."""
        # NOTE: an argv list and no shell: no word of it is ever interpreted. A new session gives the
        # script its own process group, so a timeout kills whatever it started too.
        self._process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )

    def run(self) -> ScriptResult:
        """Capture output and steps until the script exits, killing it at its timeout."""
        process = self._process
        assert process is not None and process.stdout is not None, "start() first"
        timer = threading.Timer(self.timeout_s, self._kill, kwargs={"timed_out": True})
        timer.daemon = True
        timer.start()
        try:
            output, steps = self._read(process.stdout)
            exit_code = process.wait()
        finally:
            timer.cancel()
        return ScriptResult(exit_code, self._timed_out, self._stopped, output, steps)

    def stop(self) -> None:
        """Kill the script now (the server is shutting down)."""
        self._kill(timed_out=False)

    def _kill(self, timed_out: bool) -> None:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                return
            self._timed_out, self._stopped = timed_out, not timed_out
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _read(self, stream: IO[bytes]) -> tuple[str, list[dict[str, Any]]]:
        kept: list[bytes] = []
        kept_bytes = dropped = 0
        steps: list[dict[str, Any]] = []
        reported_at, reported_bytes = time.monotonic(), 0
        for raw in iter(lambda: stream.readline(MAX_LINE_BYTES), b""):
            if kept_bytes + len(raw) <= MAX_OUTPUT_BYTES:
                kept.append(raw)
                kept_bytes += len(raw)
            else:
                dropped += len(raw)
            step = parse_step(raw.decode("utf-8", "replace"))
            if step is not None and len(steps) < MAX_STEPS:
                steps.append(step)
            else:
                step = None
            # NOTE: output so far goes out with every step and at most every progress_every_s otherwise,
            # so people watch it live without a database write per line.
            due = time.monotonic() - reported_at >= self._progress_every_s and kept_bytes > reported_bytes
            if self._on_progress is not None and (step is not None or due):
                self._on_progress(b"".join(kept).decode("utf-8", "replace"), step)
                reported_at, reported_bytes = time.monotonic(), kept_bytes
        stream.close()
        output = b"".join(kept).decode("utf-8", "replace")
        if dropped:
            output += f"\n[{dropped} more bytes of output were not kept]\n"
        return output, steps
