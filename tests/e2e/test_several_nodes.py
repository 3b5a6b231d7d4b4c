"""End to end, several nodes: three real servers on one PostgreSQL and one S3 bucket, behind a round-robin proxy.

The three start at once on an empty database (one migrates, the others wait; one writes the first
admin's password). Under load through the proxy: a version pushed through one node is canaried
through another and rolled back through a third, the leader node is killed with SIGKILL
mid-rollout and restarted, the rolled-back version is deleted, and an alert fires. Checked: every
node converges within 1 s of each change, no request fails, one leader at a time and every node
names the successor (`/api/cluster`, `flightdeck_leader`), the killed process is shown as gone,
the deleted version leaves every node's cache, each chat message is delivered once, and every
node's history rows are merged. Skipped when psycopg or the PostgreSQL server binaries are absent.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e '.[s3]')")
moto_server = pytest.importorskip("moto.server", reason="moto is not installed (the test extra)")

from sqlalchemy import func, select  # noqa: E402

from bench.rollout import BODY, call  # noqa: E402
from controlplane.auth import Role  # noqa: E402
from controlplane.auth import tokens as token_service  # noqa: E402
from controlplane.auth import users as user_service  # noqa: E402
from controlplane.db import make_engine, session_factory  # noqa: E402
from controlplane.models import Deployment, Lease, OutboxMessage, SlotSample  # noqa: E402
from tests.controlplane.console.conftest import pack_model_archive  # noqa: E402
from tests.pg import create_database, find_bindir, postgres_cluster  # noqa: E402
from tests.servers import ChatServer, Server, start_server, wait_until  # noqa: E402

pytestmark = pytest.mark.slow
PG_BIN = find_bindir()
if PG_BIN is None:
    pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found", allow_module_level=True)

NODES = ("node-a", "node-b", "node-c")
TTL_S = 3.0
CONVERGE_S = 1.0  # a change every node only has to apply (weights, a rollback)
LOAD_S = 5.0  # a first deploy: fetch from the bucket, load, warm up and golden-check, on a shared 2-core machine
HEARTBEAT_S = 1.0  # a process silent for three is shown as gone
RULE = """
rules:
  - name: busy_model
    severity: P0
    why: the test's one alert
    condition: {metric: throughput, aggregation: avg, window: 10s, op: ">", threshold: 0.2, by: [model]}
    for: 0s
    summary: "{model}: {value:.1f} requests a second"
"""
RETRIED = (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)


class Proxy:
    """A round-robin HTTP proxy; like a real load balancer it tries the next node when one refuses or drops."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends  # "127.0.0.1:port"; a restarted node's new address replaces its old one
        self.retries = 0
        lock, turn = threading.Lock(), iter(range(1 << 62))
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                for _ in range(3 * len(outer.backends)):
                    with lock:
                        backend = outer.backends[next(turn) % len(outer.backends)]
                    host, port = backend.rsplit(":", 1)
                    connection = http.client.HTTPConnection(host, int(port), timeout=30)
                    try:
                        connection.request(self.command, self.path, body, headers)
                        response = connection.getresponse()
                        data = response.read()
                    except RETRIED:
                        with lock:
                            outer.retries += 1
                        continue
                    finally:
                        connection.close()
                    self.send_response(response.status)
                    for name, value in response.getheaders():
                        if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_error(502)

            do_GET = do_POST = do_PUT = _forward  # noqa: N815 - http.server's naming

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Load:
    """Closed-loop clients through the proxy, recording every status."""

    def __init__(self, port: int, model: str, clients: int) -> None:
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(port, model), daemon=True) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, port: int, model: str) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while not self.stop.is_set():
                connection.request("POST", f"/v2/models/{model}/infer", BODY, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                self.statuses.append(response.status)
        finally:
            connection.close()

    def close(self) -> list[int]:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        return self.statuses


@pytest.fixture
def database() -> Iterator[str]:
    with postgres_cluster(PG_BIN) as cluster:
        yield create_database(cluster)  # NOTE: empty: the nodes, started at once, migrate it (one of them does)


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A bucket on a real S3 API on 127.0.0.1 (moto's server mode); returns (endpoint, name)."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "flightdeck-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "flightdeck-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint, name = f"http://{host}:{port}", f"models-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    yield endpoint, name
    server.stop()


def _operator_token(url: str) -> str:
    engine = make_engine(url)
    with session_factory(engine)() as session:
        user = user_service.create_user(session, "ops", "a-long-password-1", Role.ADMIN, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "e2e", Role.ADMIN, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return secret


def _push(server: Server, token: str, archive: Path) -> None:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="archive"; filename="{archive.name}"\r\n'
            "Content-Type: application/gzip\r\n\r\n"
        ).encode()
        + archive.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    connection = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=60)
    connection.request(
        "POST", "/api/models", body,
        {"Authorization": f"Bearer {token}", "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )  # fmt: skip
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    assert response.status == 201, answer


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _serving(server: Server, model: str) -> dict[str, tuple[str, int]]:
    """What one node's engine serves for `model`: slot -> (version, weight)."""
    status, engine = server.get("/api/engine", timeout=5)
    assert status == 200, engine
    for entry in engine["models"]:
        if entry["name"] == model:
            return {slot: (view["version"], entry["weights"].get(slot, 0)) for slot, view in entry["slots"].items()}
    return {}


def _desired(server: Server, token: str, model: str) -> dict[str, tuple[str, int]]:
    deployment = call(_port(server), "GET", f"/api/models/{model}/deployment", token)
    return {s: (v["version"], v["weight"]) for s, v in deployment["slots"].items() if v["version"]}


def _converged(nodes: dict[str, Server], token: str, model: str, since: float) -> dict[str, float]:
    """Seconds from `since` until each node's engine serves the desired state (read from any node)."""
    first = next(iter(nodes.values()))
    want = {slot: vw for slot, vw in _desired(first, token, model).items() if vw[1]}  # the slots taking traffic
    done: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while len(done) < len(nodes) and time.monotonic() < deadline:
        for name, server in nodes.items():
            if name not in done:
                have = _serving(server, model)
                if all(have.get(slot) == vw for slot, vw in want.items()):
                    done[name] = time.monotonic() - since
    assert len(done) == len(nodes), f"not converged on {set(nodes) - set(done)} to {want}"
    return done


def _written_at(url: str, model: str) -> float:
    """The monotonic time at which the model's desired state was last written (by the leader's controller)."""
    engine = make_engine(url)
    with session_factory(engine)() as session:
        age = datetime.now(UTC) - session.get(Deployment, model).updated_at
    engine.dispose()
    return time.monotonic() - age.total_seconds()


def _leader(url: str) -> str:
    engine = make_engine(url)
    with session_factory(engine)() as session:
        lease = session.get(Lease, "scheduler")
        holder = lease.holder if lease is not None and lease.expires_at > datetime.now(UTC) else ""
    engine.dispose()
    return holder


def _lease_log(server: Server, node: str) -> list[tuple[str, str, str]]:
    """(timestamp, 'took'|'lost', node) for each lease change a node logged."""
    changes = []
    for line in server.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and "the lease" in line:
            record = json.loads(line)
            changes.append(
                (record["timestamp"], "took" if " took " in record["message"] else "lost", node)
            )  # or released
    return changes


def _reports(server: Server, token: str) -> list[dict]:
    return call(_port(server), "GET", "/api/models/mlp/deployment", token)["processes"]


def _process_state(server: Server, token: str, process: str) -> str:
    """A process's state as /api/cluster shows it (alive, gone), or '' if it is not listed."""
    cluster = call(_port(server), "GET", "/api/cluster", token)
    return next((p["state"] for n in cluster["nodes"] for p in n["processes"] if p["process"] == process), "")


def _leads(server: Server) -> bool:
    """What a node's /metrics says: does it hold the lease (flightdeck_leader)?"""
    (line,) = [line for line in server.metrics().splitlines() if line.startswith("flightdeck_leader{")]
    return float(line.rsplit(" ", 1)[1]) == 1.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_three_nodes_converge_fail_over_and_deliver_once(database: str, bucket, tmp_path: Path) -> None:
    endpoint, name = bucket
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "e2e.yaml").write_text(RULE)
    archives = {
        version: pack_model_archive(tmp_path / f"mlp-{version}.tar.gz", "mlp", version) for version in ("1", "2")
    }
    alarm = pack_model_archive(tmp_path / "alarm-1.tar.gz", "alarm", "1")
    common = {
        "FLIGHTDECK_DATABASE_URL": database, "FLIGHTDECK_STORAGE_URL": f"s3://{name}/fleet",
        "FLIGHTDECK_STORAGE_ENDPOINT_URL": endpoint, "FLIGHTDECK_SECRET_KEY": secrets.token_urlsafe(48),
        "FLIGHTDECK_SECRET_KEYS": Fernet.generate_key().decode(),  # one key for receivers on every node
        "FLIGHTDECK_WORKERS": "1", "FLIGHTDECK_LEASE_TTL_S": str(TTL_S), "FLIGHTDECK_HISTORY_INTERVAL_S": "1",
        "FLIGHTDECK_ALERT_INTERVAL_S": "1", "FLIGHTDECK_OUTBOX_INTERVAL_S": "0.5", "FLIGHTDECK_ROLLOUT_TICK_S": "0.2",
        "FLIGHTDECK_ROLLOUT_PAUSE_S": "3600", "FLIGHTDECK_SCALE_DOWN_DELAY_S": "3600", "FLIGHTDECK_AUTH_READS": "false",
        "FLIGHTDECK_ALERT_RULES_DIR": str(rules), "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16",
        "FLIGHTDECK_LOG_FORMAT": "json", "FLIGHTDECK_HEARTBEAT_S": str(HEARTBEAT_S),
        "FLIGHTDECK_PROCESS_DROP_S": "3600", "FLIGHTDECK_CACHE_PRUNE_S": "1",
    }  # fmt: skip

    def start(node: str) -> Server:
        return start_server(tmp_path / node, {**common, "FLIGHTDECK_NODE": node})

    timings: dict[str, dict[str, float]] = {}
    nodes: dict[str, Server] = {}
    lease_changes: list[tuple[str, str, str]] = []
    with ChatServer() as chat:
        try:
            # All three at once on the empty database: one migrates under the advisory lock, the others wait.
            with ThreadPoolExecutor(len(NODES)) as starting:
                for node, server in zip(NODES, starting.map(start, NODES)):
                    nodes[node] = server
            written = [n for n in NODES if (tmp_path / n / "initial-admin-password").exists()]
            told = [n for n in NODES if "first admin's password is in" in nodes[n].output()]
            assert len(written) == 1 and told == written, (written, told)
            assert not [n for n in NODES if "Traceback" in nodes[n].output()]
            token = _operator_token(database)
            a, b, c = (nodes[n] for n in NODES)  # NOTE: a, b and c play the same parts whoever leads
            receiver = {"kind": "webhook", "config": {"url": chat.url, "allow_http": True}, "severities": ["P0"],
                        "matchers": [{"label": "model", "value": "alarm"}], "group_wait": "0s",
                        "group_interval": "1s"}  # fmt: skip
            call(_port(b), "PUT", "/api/receivers/chat", token, receiver)
            proxy = Proxy([f"127.0.0.1:{_port(s)}" for s in nodes.values()])
            try:
                _push(a, token, archives["1"])  # stored in the bucket: any node can load it
                since = time.monotonic()
                call(_port(b), "POST", "/api/models/mlp/deploy", token, {"version": "1"})
                timings["first deploy"] = _converged(nodes, token, "mlp", since)
                load = Load(proxy.port, "mlp", clients=2)
                try:
                    _push(a, token, archives["2"])
                    rollout = call(_port(b), "POST", "/api/models/mlp/deploy", token,
                                   {"version": "2", "strategy": "canary", "steps": [50, 100]})  # fmt: skip
                    # The leader's controller writes the first step once every process verified v2.
                    wait_until(lambda: _desired(c, token, "mlp").get(rollout["candidate_slot"], ("", 0))[1] == 50,
                               60, "the canary's first step")  # fmt: skip
                    timings["canary step"] = _converged(nodes, token, "mlp", _written_at(database, "mlp"))
                    leader = _leader(database)
                    victim = next(n for n in NODES if leader.startswith(f"{n}:"))
                    worker = int(leader.split(":")[1])
                    killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
                    os.kill(nodes[victim].process.pid, signal.SIGKILL)
                    os.kill(worker, signal.SIGKILL)
                    lease_changes += [*_lease_log(nodes[victim], f"{victim} (killed)"),
                                      (_now(), "lost", f"{victim} (killed)")]  # fmt: skip
                    nodes.pop(victim).process.wait(10)
                    successor = wait_until(lambda: (h := _leader(database)) and not h.startswith(victim) and h, 30,
                                           "a new leader")  # fmt: skip
                    takeover_s = time.monotonic() - killed_at
                    survivor = next(iter(nodes.values()))
                    # Every survivor names the successor, since the takeover; the killed process is shown gone.
                    dead = f"{victim}:{worker}"
                    for server in nodes.values():
                        cluster = call(_port(server), "GET", "/api/cluster", token)
                        assert cluster["leader"]["holder"] == successor and cluster["leader"]["current"]
                        assert datetime.fromisoformat(cluster["leader"]["since"]) >= killed_wall
                    wait_until(lambda: _process_state(survivor, token, dead) == "gone", 5 * HEARTBEAT_S + 5,
                               "the killed process shown as gone")  # fmt: skip
                    gone_s = time.monotonic() - killed_at
                    assert {p["state"] for p in _reports(survivor, token) if p["process"] == dead} == {"gone"}
                    leads = {n: _leads(s) for n, s in nodes.items()}
                    assert leads == {n: n == successor.split(":")[0] for n in nodes}, leads
                    since = time.monotonic()
                    call(_port(survivor), "POST", "/api/models/mlp/rollback", token)
                    timings["rollback"] = _converged(nodes, token, "mlp", since)
                    restarted = start(victim)
                    nodes[victim] = restarted
                    proxy.backends[NODES.index(victim)] = f"127.0.0.1:{_port(restarted)}"
                    timings["restart"] = _converged({victim: restarted}, token, "mlp", time.monotonic())
                    # v2 was rolled back: delete it through one node; every node's cached copy follows.
                    call(_port(survivor), "DELETE", "/api/models/mlp/versions/2", token)
                    deleted_at = time.monotonic()
                    digest = hashlib.sha256(archives["2"].read_bytes()).hexdigest()
                    wait_until(lambda: not [n for n in NODES if list((tmp_path / n / "cache" / "models").glob(f"{digest}*"))],
                               10, "every node to drop its copy of the deleted version")  # fmt: skip
                    evicted_s = time.monotonic() - deleted_at
                    _push(restarted, token, alarm)
                    since = time.monotonic()
                    call(_port(survivor), "POST", "/api/models/alarm/deploy", token, {"version": "1"})
                    timings["alarm deploy"] = _converged(nodes, token, "alarm", since)
                    alarm_load = Load(proxy.port, "alarm", clients=1)
                    try:
                        wait_until(lambda: [m for m in chat.received if m["status"] == "firing"], 60, "the alert")
                    finally:
                        alarm_statuses = alarm_load.close()
                finally:
                    statuses = load.close()
            finally:
                proxy.close()
            engine = make_engine(database)
            with session_factory(engine)() as session:
                wait_until(
                    lambda: session.scalar(select(func.count()).where(OutboxMessage.state == "pending")) == 0,
                    30, "the outbox to drain",
                )  # fmt: skip
                sent = session.scalar(select(func.count()).where(OutboxMessage.state == "sent"))
                sampled = {p.rsplit(":", 1)[0] for p in session.scalars(select(SlotSample.process).distinct())}
            engine.dispose()
            history = call(_port(survivor), "GET", "/api/history?metric=throughput&model=mlp&step=1", token)
        finally:
            for node, server in nodes.items():
                server.stop()
                lease_changes += _lease_log(server, node)
    print(f"\nconvergence per change and node (s): {timings}")
    print(f"leader {leader} killed; {successor} took over after {takeover_s:.2f} s (lease {TTL_S} s)")
    print(f"the killed process shown gone after {gone_s:.2f} s (heartbeat {HEARTBEAT_S} s); "
          f"a deleted version left every node's cache after {evicted_s:.2f} s (prune every 1 s)")  # fmt: skip
    print(f"{len(statuses) + len(alarm_statuses)} requests through the proxy, {proxy.retries} retried on another node")
    for change, per_node in timings.items():
        assert max(per_node.values()) <= (LOAD_S if "deploy" in change else CONVERGE_S), (change, per_node)
    assert set(statuses) == {200} and set(alarm_statuses) == {200}
    assert takeover_s <= TTL_S + 1.0
    # One leader at a time: in every node's log, and at the SIGKILL, the lease changes hands one node at a time.
    holders: set[str] = set()
    for _at, what, node in sorted(lease_changes):
        holders = holders | {node} if what == "took" else holders - {node}
        assert len(holders) <= 1, sorted(lease_changes)
    assert len([c for c in lease_changes if c[1] == "took"]) >= 2
    # Every message delivered exactly once: as many bodies as sent rows, each group told firing once.
    assert len(chat.received) == sent
    firing = [m["groupKey"] for m in chat.received if m["status"] == "firing"]
    assert len(firing) == len(set(firing)) == 1
    assert sampled == set(NODES)  # every node's history rows, in the one database the dashboards read
    # The dashboards' series add every node's rows up: one line per version and slot, not per process.
    lines = [tuple(sorted(line["labels"].items())) for line in history["series"]]
    assert (
        lines
        and len(lines) == len(set(lines))
        and all(dict(line).keys() == {"model", "version", "slot"} for line in lines)
    )
    assert sum(v for line in history["series"] for _, v in line["points"] if v) > 0
