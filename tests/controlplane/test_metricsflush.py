"""Per-request metrics wait in process memory and still add up exactly across worker processes.

Two real processes write prometheus_client's multiprocess files, as two gunicorn workers do; the
merged values are compared with a plain Prometheus histogram that saw the same observations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from controlplane.metricsflush import FLUSH_INTERVAL_S
from serving.batching import RequestOutcome
from tests.servers import wait_until

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"model": "m", "version": "1", "slot": "blue"}
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# A worker stand-in: one slot's observer, driven line by line; it answers every line with one JSON line.
WORKER = """
import json, sys
from controlplane import metrics
from serving.batching import RequestOutcome
slot = metrics.SlotMetrics("m", "1", "blue")
for line in sys.stdin:
    command, *args = line.split()
    if command == "request":
        slot.request_done(RequestOutcome(args[0]), *map(float, args[1:]))
        answer = "ok"
    elif command == "batch":
        slot.batch_done(int(args[0]), 0, 0, 0.001)
        if args[1:] == ["lone"]:  # a run on the lone-request session
            slot.lone_ran()
        answer = "ok"
    elif command == "refused":
        slot.request_refused(args[0])
        answer = "ok"
    elif command == "labels":
        slot.labels_done({("label", args[0]): 2})
        answer = "ok"
    else:
        answer = metrics.render("node-a").decode()
    print(json.dumps(answer), flush=True)
"""


class Worker:
    """A separate Python process writing the multiprocess files in `directory`."""

    def __init__(self, directory: Path) -> None:
        env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "PATH": "/usr/bin:/bin"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(self, line: str) -> str:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def exit(self) -> int:
        """Close its input: it leaves its loop and exits normally, without being asked to flush."""
        assert self.process.stdin and self.process.stdout
        self.process.stdin.close()
        code = self.process.wait(30)
        self.process.stdout.close()
        return code


def merged(directory: Path) -> dict[tuple[str, tuple], float]:
    """Read the files as /metrics does under gunicorn: every process's values merged."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.labels.get("model") == "m"
    }


def value(samples: dict, name: str, **labels: str | None) -> float:
    """The sample of `name` with LABELS and `labels` (a label given as None is one the metric does not have)."""
    wanted = {k: v for k, v in {**LABELS, **labels}.items() if v is not None}
    return samples.get((name, tuple(sorted(wanted.items()))), 0.0)


def reference(queue_values: list[float]) -> dict[str, float]:
    """Bucket counts of a plain histogram that saw `queue_values` one by one."""
    registry = CollectorRegistry()
    histogram = Histogram("q", "reference", buckets=QUEUE_BUCKETS, registry=registry)
    for v in queue_values:
        histogram.observe(v)
    return {s.labels["le"]: s.value for s in next(iter(registry.collect())).samples if s.name == "q_bucket"}


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "prometheus"
    path.mkdir()
    return path


def test_counts_from_two_processes_add_up_exactly_after_their_flushes(directory: Path) -> None:
    first = Worker(directory)
    for line in ("request success 0.0004 0.001 0.0014", "request success 0.003 0.002 0.005", "batch 1 lone", "batch 4"):
        assert first.send(line) == "ok"
    assert first.send("request timeout 0.2 0 0.2") == "ok"  # counted, but no latency: it never ran
    assert first.exit() == 0  # flushed at exit, not by being asked

    second = Worker(directory)
    try:
        for line in ("request success 0.2 0.01 0.21", "request client_error 0.0001 0.001 0.0011", "batch 2"):
            assert second.send(line) == "ok"
        # A scrape in the process that counted shows its own counts at once, merged with the first's.
        scraped = {
            (s.name, s.labels.get("outcome")): s.value
            for family in text_string_to_metric_families(second.send("render"))
            for s in family.samples
            if s.labels.get("model") == "m" and s.name == "flightdeck_inference_requests_total"
        }
        assert scraped[("flightdeck_inference_requests_total", "success")] == 3
        assert scraped[("flightdeck_inference_requests_total", "client_error")] == 1
        assert scraped[("flightdeck_inference_requests_total", "timeout")] == 1

        # Counted after that scrape: another process sees it once the background flush ran.
        assert second.send("request success 0.02 0.001 0.021") == "ok"
        wait_until(
            lambda: value(merged(directory), "flightdeck_inference_requests_total", outcome="success") >= 4,
            10 * FLUSH_INTERVAL_S,
            "the background flush to write the last request",
        )
    finally:
        assert second.exit() == 0

    samples = merged(directory)
    outcomes = {o.value: value(samples, "flightdeck_inference_requests_total", outcome=o.value) for o in RequestOutcome}
    assert outcomes == {"success": 4, "error": 0, "client_error": 1, "timeout": 1, "rejected": 0}
    queue_values = [0.0004, 0.003, 0.2, 0.0001, 0.02]  # the runs' queue times; the timeout's is not observed
    buckets = {le: value(samples, "flightdeck_inference_queue_seconds_bucket", le=le) for le in reference(queue_values)}
    assert buckets == reference(queue_values)
    assert value(samples, "flightdeck_inference_queue_seconds_count") == 5
    assert value(samples, "flightdeck_inference_queue_seconds_sum") == pytest.approx(sum(queue_values))
    assert value(samples, "flightdeck_inference_request_seconds_sum") == pytest.approx(0.0064 + 0.21 + 0.0011 + 0.021)
    assert value(samples, "flightdeck_inference_exec_count_total") == 3
    assert value(samples, "flightdeck_inference_lone_runs_total") == 1
    assert value(samples, "flightdeck_inference_count_total") == 1 + 4 + 2
    assert value(samples, "flightdeck_inference_batch_size_bucket", le="1.0") == 1
    assert value(samples, "flightdeck_inference_batch_size_bucket", le="2.0") == 2
    assert value(samples, "flightdeck_inference_batch_size_bucket", le="4.0") == 3


def test_each_kind_of_update_alone_wakes_the_flusher(directory: Path) -> None:
    """An idle flusher sleeps until something is counted: every update must wake it, or its counts wait."""
    worker = Worker(directory)
    try:
        steps = (
            ("request success 0.001 0.001 0.002", "flightdeck_inference_requests_total", {"outcome": "success"}),
            ("refused shape", "flightdeck_inference_client_errors_total", {"reason": "shape"}),
            ("batch 3", "flightdeck_inference_exec_count_total", {}),
            ("batch 1 lone", "flightdeck_inference_lone_runs_total", {}),
            ("labels cat", "flightdeck_prediction_label_total", {"slot": None, "output": "label", "label": "cat"}),
        )
        for line, name, labels in steps:
            before = value(merged(directory), name, **labels)
            assert worker.send(line) == "ok"
            wait_until(
                lambda: value(merged(directory), name, **labels) > before,  # noqa: B023 (called at once)
                10 * FLUSH_INTERVAL_S,
                f"the background flush to write {line!r}",
            )
    finally:
        assert worker.exit() == 0
