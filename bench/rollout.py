"""Benchmark: how fast traffic moves on a switch and a rollback (`python -m bench.rollout`).

Starts the real server (gunicorn, two workers, each with its own engine), keeps closed-loop
clients busy on `mlp`, and repeats: blue-green deploy of v2, then rollback to v1. For each it
reports when the command returned (or the rollout showed succeeded) until every response came
from the new version, and counts any request that failed (target: none, and under 50 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.engine import Server
from controlplane.auth import Role
from controlplane.auth import tokens as token_service
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from controlplane.migrate import upgrade
from serving.demo_models import write_demo_models

BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def operator_token(home: Path) -> str:
    """Migrate the database under `home` and return a new operator's API token."""
    url = f"sqlite:///{home / 'flightdeck.db'}"
    upgrade(url)
    engine = make_engine(url)
    with session_factory(engine)() as session:
        user = user_service.create_user(session, "bench", "bench-password-1", Role.OPERATOR, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "bench", Role.OPERATOR, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return secret


class Traffic:
    """Closed-loop keep-alive clients recording (time, status, version); each picks its bodies at random."""

    def __init__(self, port: int, clients: int, model: str = "mlp", bodies: Sequence[bytes] = (BODY,)) -> None:
        self.port, self.path, self.bodies = port, f"/v2/models/{model}/infer", bodies
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.seen: list[tuple[float, int, str]] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, index: int) -> None:
        pick = random.Random(index)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            while not self.stop.is_set():
                connection.request("POST", self.path, pick.choice(self.bodies), {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                with self.lock:
                    self.seen.append((time.monotonic(), response.status, response.getheader("X-Model-Version", "")))
        finally:
            connection.close()

    def statuses(self) -> Counter[int]:
        """Return how many answers of each status came so far."""
        with self.lock:
            return Counter(status for _, status, _ in self.seen)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def settled(self, version: str, after: float, timeout: float = 30) -> float:
        """Seconds from `after` to the last response of another version (20 of `version` must follow it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                later = [s for s in self.seen if s[0] > after]
            last_other = max((t for t, _, v in later if v != version), default=after)
            if sum(1 for t, _, v in later if v == version and t > last_other) >= 20:
                return last_other - after
            time.sleep(0.005)
        raise RuntimeError(f"traffic never settled on {version}")


def call(port: int, method: str, path: str, token: str, body: dict | None = None) -> dict:
    """Call the management API with a token; raise on an error status."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection.request(method, path, json.dumps(body) if body else None, headers)
    response = connection.getresponse()
    data = json.loads(response.read() or b"{}")
    connection.close()
    if response.status >= 400:
        raise RuntimeError(f"{method} {path}: {response.status} {data}")
    return data


def main(argv: list[str] | None = None) -> int:
    """Run the switch/rollback rounds and print the timings."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    switches, rollbacks = [], []
    with tempfile.TemporaryDirectory(prefix="flightdeck-switch-") as tmp:
        store, home = Path(tmp) / "store", Path(tmp) / "home"
        write_demo_models(store)
        home.mkdir()
        token = operator_token(home)
        env = {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_ROLLOUT_TICK_S": "0.1",
               "FLIGHTDECK_SCALE_DOWN_DELAY_S": "3600"}  # fmt: skip
        server = Server(store, home, env)
        try:
            server.wait_ready()
            traffic = Traffic(server.port, args.clients)
            traffic.settled("1", 0.0)
            for _ in range(args.rounds):
                rollout = call(
                    server.port, "POST", "/api/models/mlp/deploy", token, {"version": "2", "strategy": "bluegreen"}
                )
                while rollout["state"] != "succeeded":
                    rollout = call(server.port, "GET", f"/api/rollouts/{rollout['id']}", token)
                switches.append(traffic.settled("2", time.monotonic()))
                call(server.port, "POST", "/api/models/mlp/rollback", token)
                rollbacks.append(traffic.settled("1", time.monotonic()))
            traffic.close()
        finally:
            server.stop()
    statuses = {s for _, s, _ in traffic.seen}
    failed = sum(1 for _, s, _ in traffic.seen if s != 200)
    print(
        f"{args.rounds} rounds, 2 workers, {args.clients} clients, {len(traffic.seen)} requests, statuses {sorted(statuses)}"
    )
    for name, values in (
        ("switch (after the rollout shows succeeded)", switches),
        ("rollback (after the command returns)", rollbacks),
    ):
        ms = [v * 1000 for v in values]
        print(
            f"  {name}: median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms  ({', '.join(f'{v:.0f}' for v in ms)})"
        )
    print(f"  {'PASS' if failed == 0 else 'FAIL'}  no failed request ({failed} failed)")
    print(f"  {'PASS' if max(rollbacks) < 0.05 else 'FAIL'}  traffic moves within 50 ms of the rollback returning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
