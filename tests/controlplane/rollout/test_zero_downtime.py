"""Under continuous load over real HTTP (gunicorn, two workers), a rollout and a rollback fail no request."""

from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from controlplane.auth import Role
from controlplane.auth import tokens as token_service
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from tests.servers import start_server

BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def operator_token(home: Path) -> str:
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    with session_factory(engine)() as session:
        user = user_service.create_user(session, "otto", "a-long-password-1", Role.OPERATOR, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "zero-downtime", Role.OPERATOR, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return secret


class Load:
    """Closed-loop clients on keep-alive connections, recording (time, status, version) per response."""

    def __init__(self, port: int, clients: int = 4) -> None:
        self.port = port
        self.stop = threading.Event()
        self.seen: list[tuple[float, int, str]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            connection.request("POST", "/v2/models/mlp/infer", BODY, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            with self.lock:
                self.seen.append((time.monotonic(), response.status, response.getheader("X-Model-Version", "")))
        connection.close()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def wait_for(self, version: str, after: float, timeout: float = 30) -> float:
        """Return when responses after `after` are all `version` (the last other one is followed by 20 of it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                later = [s for s in self.seen if s[0] > after]
            others = [t for t, _, v in later if v != version]
            last_other = max(others, default=after)
            if sum(1 for t, _, v in later if v == version and t > last_other) >= 20:
                return last_other - after
            time.sleep(0.01)  # polling an observation of live traffic, bounded by the deadline
        raise AssertionError(f"traffic never settled on version {version}")


def call(server, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = connection.getresponse()
    data = json.loads(response.read() or b"{}")
    connection.close()
    return response.status, data


def test_blue_green_rollout_and_rollback_under_load_fail_nothing(home: Path) -> None:
    token = operator_token(home)
    server = start_server(
        home, {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_WORKERS": "2", "FLIGHTDECK_ROLLOUT_TICK_S": "0.1"}
    )
    port = int(server.url.rsplit(":", 1)[1])
    try:
        with Load(port) as load:
            load.wait_for("1", after=0.0)
            status, rollout = call(
                server, "POST", "/api/models/mlp/deploy", token, {"version": "2", "strategy": "bluegreen"}
            )
            assert status == 202, rollout
            deadline = time.monotonic() + 60
            while rollout["state"] != "succeeded":
                assert rollout["state"] in ("loading", "progressing") and time.monotonic() < deadline, rollout
                status, rollout = call(server, "GET", f"/api/rollouts/{rollout['id']}", token)
            switched_at = time.monotonic()
            switch_s = load.wait_for("2", after=switched_at)
            status, result = call(server, "POST", "/api/models/mlp/rollback", token)
            returned_at = time.monotonic()
            assert status == 200 and result["version"] == "1" and not result["reloaded"], result
            rollback_s = load.wait_for("1", after=returned_at)
        statuses = {s for _, s, _ in load.seen}
        print(f"\nrequests {len(load.seen)}, statuses {statuses}; all on v2 {switch_s * 1000:.0f} ms after the "
              f"rollout showed succeeded; all on v1 {rollback_s * 1000:.0f} ms after the rollback returned")  # fmt: skip
        assert statuses == {200}, "a request failed during the rollout or rollback"
        assert {v for _, _, v in load.seen} == {"1", "2"}
        assert rollback_s < 0.5  # both workers moved within a few reconcile polls
    finally:
        assert server.stop() == 0
