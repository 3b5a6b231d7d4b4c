"""The job process: the lease holder's window jobs in a process of their own, replaced when it grows.

Why (issue 29, item 8): under steady load the lease holder's RSS grew 6-27 MB an hour while its live
data stayed flat (SECURITY.md, "Live data does not grow; the heap grows around it"). The growth followed
the rows the window jobs read: glibc's heap grew around the small blocks that stayed live between
runs, in a process that also serves. No one object kept it, so there was nothing to free. A process
of their own bounds it the way Celery's `max_memory_per_child` and gunicorn's `max_requests` do:
once its RSS has grown `job_process_max_growth_mb` past what it had after its first run of every
job, it finishes the job in hand, answers, and exits; the next job starts a fresh one (~1 s of CPU).

The worker keeps the lease and the timers; each window job is one request on the child's stdin
(`{"job": ..., "engine_ready": ...}`, a JSON line) and one answer on its stdout. The child is a
fresh interpreter (no fork of a threaded worker) given the worker's settings on its first line,
and it exits when its stdin closes: when the worker closes it, or dies, even by SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pydantic_core

import controlplane
from controlplane import metrics
from controlplane.config import Settings, secret_fields
from serving.memory import rss_bytes, trim_heap

log = logging.getLogger(__name__)

MB = 1 << 20
CLOSE_WAIT_S = 5.0  # how long `close` waits for the child to finish the job in hand before it is killed


class JobProcessError(RuntimeError):
    """The job process failed a job, gave no answer in time, or exited during one."""


def settings_json(settings: Settings) -> bytes:
    """Return the settings as one JSON line, secrets included: the child builds the same `Settings` from it."""
    raw = settings.model_dump()
    for name in secret_fields():
        raw[name] = raw[name].get_secret_value()
    return pydantic_core.to_json(raw) + b"\n"


class JobProcess:
    """The worker's end: start the child when a job needs it, send it jobs one at a time, replace it."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()  # one job at a time: the child reads one request, then answers it
        self._process: subprocess.Popen[bytes] | None = None
        self._why_next = "first"  # why the next start happens: the label of flightdeck_job_process_starts_total
        self._pending = b""  # bytes read past the last answer's newline (none in practice: one answer per request)
        self._closed = False

    @property
    def pid(self) -> int | None:
        """Return the child's pid, or None while none runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def run(self, job: str, *, engine_ready: bool) -> Any:
        """Run `job` in the child and return its result; raise JobProcessError if it failed or the child did."""
        with self._lock:
            if self._closed:
                raise JobProcessError(f"the job process is closed (the server is stopping): {job} not run")
            if self._process is not None and self._process.poll() is not None:
                log.error("job process %d exited between jobs (status %s)", self._process.pid, self._process.returncode)
                self._reap(self._process, "exited")
            process = self._process or self._start()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(json.dumps({"job": job, "engine_ready": engine_ready}).encode() + b"\n")
                process.stdin.flush()
            except (BrokenPipeError, ValueError):  # the child is gone, or `close` closed its stdin
                self._lost(process, "exited")
                raise JobProcessError(f"the job process exited before it took {job}") from None
            reply = self._answer(process, job)
            metrics.JOB_PROCESS_RSS.set(reply["rss"])
            if reply.get("retiring"):
                self._reap(process, "retired")
                log.info("job process %d retired at %.0f MiB (%s)", process.pid, reply["rss"] / MB, reply["retiring"])
            if not reply["ok"]:
                raise JobProcessError(f"{job} failed in the job process: {reply['error']}")
            return reply["result"]

    def release(self) -> None:
        """Stop the child between jobs, when this worker no longer leads; the next job starts another."""
        if not self._lock.acquire(blocking=False):
            return  # a job in hand (a leader's last, or a new leader's first): the next renewal tries again
        try:
            process = self._process
            if process is not None and not self._closed:
                self._reap(process, "lease")
                metrics.JOB_PROCESS_RSS.set(0)
                log.info("job process %d stopped: this worker no longer holds the lease", process.pid)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close the child's stdin and wait a moment for it to exit, then kill it; start no other."""
        # NOTE: not under the lock, so a job in hand that hangs cannot hold up the server's stop. Only stdin is
        # closed here: the thread waiting for that job's answer gets it (the child answers, then reads the end of
        # its input) or the end of the pipe, and reaps the child itself.
        self._closed = True
        process = self._process
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
        except (OSError, ValueError):  # a flush into a pipe whose reader is gone
            pass
        try:
            process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._lock.acquire(blocking=False):  # no job in hand: tidy up here
            try:
                if self._process is process:
                    self._reap(process, "first")
            finally:
                self._lock.release()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}  # the worker publishes
        source = str(Path(controlplane.__file__).resolve().parent.parent)  # a checkout run by gunicorn --pythonpath
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "controlplane.jobprocess"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert process.stdin is not None
        process.stdin.write(settings_json(self._settings))
        process.stdin.flush()
        metrics.JOB_PROCESS_STARTS.labels(self._why_next).inc()
        log.info("job process %d started (%s)", process.pid, self._why_next)
        self._process, self._pending = process, b""
        return process

    def _answer(self, process: subprocess.Popen[bytes], job: str) -> dict[str, Any]:
        """Read one answer line within the timeout; on none, the child is killed and the job fails."""
        assert process.stdout is not None
        fd = process.stdout.fileno()
        deadline = time.monotonic() + self._settings.job_process_timeout_s
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._lost(process, "timeout")
                timeout = self._settings.job_process_timeout_s
                raise JobProcessError(f"{job} gave no answer within {timeout:g} s; the job process was killed")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = self._lost(process, "exited")
                raise JobProcessError(f"the job process exited (status {code}) during {job}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def _lost(self, process: subprocess.Popen[bytes], why: str) -> int | None:
        log.error("job process %d %s", process.pid, "gave no answer in time: killed" if why == "timeout" else why)
        process.kill()
        return self._reap(process, why)

    def _reap(self, process: subprocess.Popen[bytes], why_next: str) -> int | None:
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a flush into a pipe whose reader is gone
                    pass
        try:
            code = process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        self._process, self._why_next = None, why_next
        return code


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child's loop: settings on the first line, then one job per line until EOF; exit past the bound."""
    from controlplane.db import make_engine, session_factory
    from controlplane.logconfig import configure_logging
    from controlplane.runbooks.runner import build_runner
    from controlplane.windowjobs import WINDOW_JOBS, WindowJobs, build_evaluator, load_alert_rules

    first = requests.readline()
    if not first:
        return
    settings = Settings(**json.loads(first))
    configure_logging(settings)
    sessions = session_factory(make_engine(settings.sqlalchemy_url))
    engine_ready = [True]
    rules, _ = load_alert_rules(settings)
    evaluator = build_evaluator(settings, sessions, rules, build_runner(settings, sessions), lambda: engine_ready[0])
    jobs = WindowJobs(settings, sessions, evaluator)
    bound = settings.job_process_max_growth_mb * MB
    ran: set[str] = set()
    baseline: int | None = None  # RSS once every window job has run once: its caches and pools are full
    for line in requests:
        request = json.loads(line)
        engine_ready[0] = bool(request.get("engine_ready", True))
        reply: dict[str, Any] = {"ok": True, "result": None, "retiring": ""}
        try:
            reply["result"] = jobs.run(request["job"])
        except Exception as exc:
            log.exception("window job %s failed", request.get("job"))
            reply.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        trim_heap()
        reply["rss"] = rss = rss_bytes()
        ran.add(request.get("job", ""))
        if baseline is None and ran >= set(WINDOW_JOBS):
            baseline = rss
        elif baseline is not None and rss - baseline > bound:
            reply["retiring"] = f"{(rss - baseline) / MB:.1f} MiB over its {baseline / MB:.0f} MiB once warm"
        answers.write(pydantic_core.to_json(reply) + b"\n")
        answers.flush()
        if reply["retiring"]:
            return


def main() -> None:
    """Run as `python -m controlplane.jobprocess`, started by a worker: the protocol is on stdin and stdout."""
    # NOTE: Ctrl-C at a terminal signals the whole foreground group; the worker, not the key, ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print() goes to the log, not into the answers
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
