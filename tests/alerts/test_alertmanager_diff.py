"""Flightdeck's notifications against the real Prometheus Alertmanager, scenario by scenario.

Each scenario is a script over time (seconds): a rule's condition holding or not on a model, a
silence created or expired, the webhook receiver going down or up. Flightdeck runs it first, in
virtual time: its real evaluator (the script is what the rules observe), notification groups and
outbox over a real SQLite file, stepped every 0.25 s and delivering over HTTP to a webhook sink on
127.0.0.1. Its alert states, as they change, are the stream fed to Alertmanager as Prometheus
would (`POST /api/v2/alerts`, startsAt and, once resolved, endsAt). Then every scenario's
Alertmanager runs at once, in real time: the Debian `prometheus-alertmanager` binary on 127.0.0.1,
configured by `alerts.amconfig` from the same receivers, with its own sink. The messages of each
(receiver, group) must be the same (status, groupKey, groupLabels, alerts with their labels and
status, in order) and arrive within one group_interval of each other.

Timings are short (group_wait 1 s, group_interval 2 s, repeat 5 s where it is the subject, else 60 s); script events sit at least
0.5 s from any group tick, so a starved machine's scheduling delays cannot reorder them.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from alerts.amconfig import alertmanager_config
from alerts.dispatch import Route
from alerts.lifecycle import Matcher
from alerts.rules import Condition, Rule
from alerts.states import Severity
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.alerting.outbox import deliver_due
from controlplane.models import AlertRecord, Receiver, SilenceRecord
from tests.alerts.notifiers.recorder import deliver_local

pytestmark = pytest.mark.slow

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
STEP = 0.25
GROUP_WAIT, GROUP_INTERVAL = 1.0, 2.0


def rule(name: str, severity: str) -> Rule:
    condition = Condition("error_rate", "max", timedelta(minutes=1), ">", 0.5, ("model",))
    return Rule(name, Severity(severity), "test", condition, timedelta(0), "{model} fails")


RULES = [rule("errors", "P1"), rule("outage", "P0")]


@dataclass(frozen=True)
class Recv:
    """A receiver as people configure it (every one a webhook to the scenario's sink)."""

    name: str
    severities: tuple[str, ...] = ("P0", "P1", "P2")
    matchers: tuple[tuple[str, str], ...] = ()
    group_by: tuple[str, ...] = ("alertname",)


@dataclass(frozen=True)
class Scenario:
    name: str
    events: tuple[
        tuple, ...
    ]  # (t, "set", rule, model, holds) | (t, "silence", model) | (t, "expire", model) | (t, "down"/"up")
    duration: float
    receivers: tuple[Recv, ...] = (Recv("chat"),)
    repeat: float = 60.0  # longer than any scenario but one, so that a repeat never hides a difference


SCENARIOS = [
    Scenario("fire_resolve", ((0.5, "set", "errors", "textcls", True), (3.0, "set", "errors", "textcls", False)), 6),
    Scenario(
        "two_alerts_in_a_group",
        (
            (0.5, "set", "errors", "textcls", True),
            (1.0, "set", "errors", "mlp", True),
            (4.0, "set", "errors", "mlp", False),
            (8.0, "set", "errors", "textcls", False),
        ),
        11,
    ),
    Scenario(
        "silence_before_firing",
        (
            (0.0, "silence", "textcls"),
            (0.5, "set", "errors", "textcls", True),
            (5.0, "expire", "textcls"),
            (8.0, "set", "errors", "textcls", False),
        ),
        11,
    ),
    Scenario(
        "silence_while_firing_then_resolve",
        (
            (0.5, "set", "errors", "textcls", True),
            (2.5, "silence", "textcls"),
            (4.0, "set", "errors", "textcls", False),
            (7.0, "expire", "textcls"),
        ),
        10,
    ),
    Scenario(
        # Alertmanager retries the first send for 10 s (its minimum notify timeout), then gives up;
        # the receiver is back only after that, so neither may deliver the FIRING the silence covers.
        "silence_while_undelivered",
        (
            (0.0, "down"),
            (0.5, "set", "errors", "textcls", True),
            (3.0, "silence", "textcls"),
            (12.5, "up"),
            (13.0, "expire", "textcls"),
            (16.0, "set", "errors", "textcls", False),
        ),
        19,
    ),
    Scenario(
        "inhibition_then_release",
        (
            (0.5, "set", "outage", "textcls", True),
            (1.0, "set", "errors", "textcls", True),
            (5.0, "set", "outage", "textcls", False),
            (9.0, "set", "errors", "textcls", False),
        ),
        12,
    ),
    Scenario("repeat_interval", ((0.5, "set", "errors", "textcls", True),), 15, repeat=5.0),
    Scenario(
        "receiver_with_matchers",
        (
            (0.5, "set", "errors", "textcls", True),
            (1.0, "set", "errors", "mlp", True),
            (4.0, "set", "errors", "textcls", False),
            (6.0, "set", "errors", "mlp", False),
        ),
        9,
        (Recv("chat"), Recv("textcls_only", ("P1",), (("model", "textcls"),), ("alertname", "model"))),
    ),
]


def routes(scenario: Scenario) -> list[Route]:
    seconds = timedelta(seconds=1)
    return [
        Route(r.name, r.severities, tuple(Matcher(k, v) for k, v in r.matchers), r.group_by,
              GROUP_WAIT * seconds, GROUP_INTERVAL * seconds, scenario.repeat * seconds)
        for r in scenario.receivers
    ]  # fmt: skip


class Sink:
    """A webhook receiver on 127.0.0.1 recording (time by `clock`, body); answers 503 while `down`."""

    def __init__(self, clock) -> None:
        self.clock, self.down, self.received = clock, False, []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not sink.down:
                    sink.received.append((sink.clock(), json.loads(body)))
                self.send_response(503 if sink.down else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Run:
    """What one side did: the messages (time, body) and, from Flightdeck, the feed for Alertmanager."""

    messages: list[tuple[float, dict]] = field(default_factory=list)
    feed: list[tuple] = field(default_factory=list)  # (t, kind, ...) in order
    log: str = ""  # Alertmanager's own log, shown when it differs


def run_flightdeck(scenario: Scenario, sessions) -> Run:
    """Step the scenario through Flightdeck in virtual time; record its messages and its alert stream."""
    clock = {"t": 0.0}
    values: dict[tuple[str, str], float] = {}

    def observer(_session, rule: Rule, _now):
        return {(("model", m),): v for (r, m), v in values.items() if r == rule.name}

    def now() -> datetime:
        return T0 + timedelta(seconds=clock["t"])

    evaluator = AlertEvaluator(sessions, RULES, EvaluatorSettings(console_url="http://console"),
                               engine_ready=lambda: True, clock=now, observer=observer)  # fmt: skip
    sink = Sink(lambda: clock["t"])
    run = Run()
    try:
        with sessions() as s, s.begin():
            for route in routes(scenario):
                s.add(Receiver(name=route.receiver, kind="webhook", config={"url": sink.url, "allow_http": True},
                               severities=list(route.severities), enabled=True, created_at=T0,
                               matchers=[{"label": m.label, "value": m.value} for m in route.matchers],
                               group_by=list(route.group_by), group_wait_s=GROUP_WAIT,
                               group_interval_s=GROUP_INTERVAL,
                               repeat_interval_s=route.repeat_interval.total_seconds()))  # fmt: skip
        events, states, silences = list(scenario.events), {}, {}
        for step in range(int(scenario.duration / STEP) + 1):
            clock["t"] = t = step * STEP
            while events and events[0][0] <= t:
                event = events.pop(0)
                kind = event[1]
                if kind == "set":
                    values[(event[2], event[3])] = 1.0 if event[4] else 0.0
                    continue
                run.feed.append((t, *event[1:]))
                if kind in ("down", "up"):
                    sink.down = kind == "down"
                elif kind == "silence":
                    with sessions() as s, s.begin():
                        row = SilenceRecord(matchers=[{"label": "model", "value": event[2]}], starts_at=now(),
                                            ends_at=now() + timedelta(hours=1), author="diff", comment="",
                                            created_at=now())  # fmt: skip
                        s.add(row)
                        s.flush()
                        silences[event[2]] = row.id
                else:
                    with sessions() as s, s.begin():
                        row = s.get(SilenceRecord, silences[event[2]])
                        row.expired_by, row.ends_at = "diff", now()
            evaluator.run()
            with sessions() as s:
                for a in s.scalars(select(AlertRecord).order_by(AlertRecord.fingerprint)):
                    if states.get(a.fingerprint) != a.state and a.state in ("firing", "resolved"):
                        ends = (a.resolved_at - T0).total_seconds() if a.state == "resolved" else None
                        run.feed.append((t, "alert", dict(a.labels), (a.firing_since - T0).total_seconds(), ends))
                    states[a.fingerprint] = a.state
            deliver_due(sessions, now=now(), send=deliver_local, backoff_s=0.5)
        run.messages = list(sink.received)
    finally:
        sink.close()
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, method: str, path: str, body=None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=5) as answer:
        return answer.read()


def run_alertmanager(scenario: Scenario, feed: list[tuple], folder: Path) -> Run:
    """Play Flightdeck's alert stream into a real Alertmanager in real time; record what it sends."""
    start = {"mono": 0.0}
    sink = Sink(lambda: time.monotonic() - start["mono"])
    config = alertmanager_config(routes(scenario), {r.name: sink.url for r in scenario.receivers})
    (folder / "am.yml").write_text(yaml.safe_dump(config))
    for _ in range(3):
        process, base = start_alertmanager(folder, sink.url)
        if process is not None:
            break
    else:
        sink.close()
        raise RuntimeError(f"alertmanager did not start: {(folder / 'am.log').read_text()}")
    try:
        start["mono"], wall = time.monotonic(), datetime.now(UTC)

        def at(seconds: float) -> str:
            return (wall + timedelta(seconds=seconds)).isoformat()

        silences = {}
        for t, kind, *rest in feed:
            time.sleep(max(0.0, start["mono"] + t - time.monotonic()))
            if kind in ("down", "up"):
                sink.down = kind == "down"
            elif kind == "silence":
                body = {"matchers": [{"name": "model", "value": rest[0], "isRegex": False, "isEqual": True}],
                        "startsAt": at(t), "endsAt": at(t + 3600), "createdBy": "diff", "comment": "diff"}  # fmt: skip
                silences[rest[0]] = json.loads(call(base, "POST", "/api/v2/silences", body))["silenceID"]
            elif kind == "expire":
                call(base, "DELETE", f"/api/v2/silence/{silences[rest[0]]}")
            else:
                labels, starts, ends = rest
                alert = {"labels": labels, "annotations": {}, "startsAt": at(starts),
                         "endsAt": at(ends if ends is not None else starts + 3600),
                         "generatorURL": "http://console"}  # fmt: skip
                call(base, "POST", "/api/v2/alerts", [alert])
        time.sleep(max(0.0, start["mono"] + scenario.duration - time.monotonic()))
        return Run(messages=list(sink.received), log=(folder / "am.log").read_text())
    finally:
        process.terminate()
        process.wait(timeout=10)
        sink.close()


def start_alertmanager(folder: Path, sink_url: str) -> tuple[subprocess.Popen | None, str]:
    """Start Alertmanager on a free port; return it and its URL once it answers as itself (None: it did not).

    NOTE: the port is free when chosen, not when Alertmanager binds it, and eight start at once. One that
    lost its port to another exits, while the other answers /-/ready: its configuration (our sink's URL)
    tells them apart.
    """
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [BINARY, f"--config.file={folder / 'am.yml'}", f"--storage.path={folder / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
    with (folder / "am.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 20
    while process.poll() is None and time.monotonic() < deadline:
        try:
            status = json.loads(call(base, "GET", "/api/v2/status"))
        except OSError:
            time.sleep(0.05)
            continue
        if sink_url in status["config"]["original"] and process.poll() is None:
            return process, base
        break
    process.terminate()
    process.wait(timeout=10)
    return None, base


def streams(run: Run) -> dict[tuple[str, str], list[tuple[float, tuple]]]:
    """Each (receiver, groupKey)'s messages in order: time, then what must be equal."""
    out: dict[tuple[str, str], list] = defaultdict(list)
    for t, body in run.messages:
        alerts = tuple((a["status"], tuple(sorted(a["labels"].items()))) for a in body["alerts"])
        content = (body["status"], body["groupKey"], tuple(sorted(body["groupLabels"].items())), alerts)
        out[(body["receiver"], body["groupKey"])].append((t, content))
    return dict(out)


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, tuple[Run, Run]]:
    """Every scenario through Flightdeck (one after another, virtual time), then every Alertmanager at once."""
    if BINARY is None:
        pytest.skip("no alertmanager binary (apt-get install prometheus-alertmanager; .ci/run does)")
    from controlplane.db import make_engine, session_factory
    from controlplane.migrate import upgrade

    root = tmp_path_factory.mktemp("amdiff")
    template = root / "template.db"
    upgrade(f"sqlite:///{template}")
    flightdeck = {}
    for scenario in SCENARIOS:
        db = root / f"{scenario.name}.db"
        shutil.copy(template, db)
        engine = make_engine(f"sqlite:///{db}")
        try:
            flightdeck[scenario.name] = run_flightdeck(scenario, session_factory(engine))
        finally:
            engine.dispose()
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        futures = {}
        for scenario in SCENARIOS:
            (root / scenario.name).mkdir()
            feed = flightdeck[scenario.name].feed
            futures[scenario.name] = pool.submit(run_alertmanager, scenario, feed, root / scenario.name)
        return {name: (flightdeck[name], future.result()) for name, future in futures.items()}


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
def test_flightdeck_sends_what_alertmanager_sends(both, scenario: str) -> None:
    ours, theirs = (streams(run) for run in both[scenario])
    shown = f"Flightdeck: {brief(ours)}\nAlertmanager: {brief(theirs)}"
    assert theirs, f"Alertmanager sent nothing: every scenario sends something\n{shown}\n{both[scenario][1].log}"
    assert {k: [c for _, c in v] for k, v in ours.items()} == {k: [c for _, c in v] for k, v in theirs.items()}, shown
    for key, messages in theirs.items():
        for (t_ours, _), (t_theirs, _) in zip(ours[key], messages):
            assert abs(t_ours - t_theirs) <= GROUP_INTERVAL, shown


def brief(found: dict) -> dict:
    """Streams in short: per group, (time, status, [alert status:model ...])."""
    return {
        key[1]: [(round(t, 2), c[0], [f"{a[0]}:{dict(a[1]).get('model', '')}" for a in c[3]]) for t, c in messages]
        for key, messages in found.items()
    }
