"""Engine-wide desired state end to end: batching limits, memory compaction and slot reloads.

The API writes desired state; the process's reconciler (called here to converge at once) applies it
to the real engine and reports it. The runbooks are run against the real gunicorn server at the end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from bench.rollout import Traffic, call, operator_token
from controlplane.models import AuditEvent, EngineStatus, SlotStatus
from tests.runbooks.conftest import RUNBOOKS, run_script, step_lines
from tests.servers import start_server

BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}
MLP_HINT = 64  # the demo mlp manifest's own max_batch_size


def settle(app) -> None:
    app.extensions["flightdeck"].reconciler.reconcile()


def engine(app):
    return app.extensions["flightdeck"].engine


def batcher(app, slot: str = "blue"):
    return next(v for v in engine(app).loaded("mlp") if v.slot == slot).batcher


def audit(app, action: str) -> list[AuditEvent]:
    with app.extensions["flightdeck"].sessions() as session:
        return list(session.scalars(select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)))


def me(client) -> dict:
    """This process's row in GET /api/engine/desired (the test app is the only process)."""
    processes = client.get("/api/engine/desired").get_json()["processes"]
    assert len(processes) == 1, processes
    return processes[0]


def infer(client, batch: int = 1):
    body = {"inputs": [{"name": "input", "shape": [batch, 64], "datatype": "FP32", "data": [0.25] * 64 * batch}]}
    return client.post("/v2/models/mlp/infer", json=body)


def test_a_batching_change_reaches_every_live_batcher_and_later_loads(app, client, operator) -> None:
    settle(app)
    desired = client.get("/api/engine/desired").get_json()
    assert desired["generation"] == 1 and desired["compact_generation"] == 0
    assert desired["batching"] == {"max_batch_size": 32, "max_queue_delay_ms": 2.0, "max_queue_size": 128}
    assert me(client)["generation"] == 1 and me(client)["error"] == ""

    limits = {"max_batch_size": 4, "max_queue_delay_ms": 7.5, "max_queue_size": 9}
    response = client.put("/api/engine/batching", json=limits, headers=operator)
    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {"generation": 2, "batching": limits}
    settle(app)
    live = batcher(app)
    assert (live.max_batch_size, live.max_queue_delay_s, live.max_queue_size) == (4, 0.0075, 9)
    assert engine(app).batching.max_queue_size == 9
    assert me(client)["generation"] == 2 and me(client)["error"] == ""
    assert infer(client).status_code == 200
    assert infer(client, batch=5).status_code == 400  # over the new batch limit

    # A version loaded after the change gets the new limits too.
    deployed = client.post("/api/models/mlp/deploy", json={"version": "2"}, headers=operator)
    assert deployed.status_code == 202, deployed.get_json()
    settle(app)
    assert batcher(app, "green").max_queue_size == 9 and batcher(app, "green").max_batch_size == 4

    # Only what is given changes; null hands a limit back to the process's own setting.
    partial = client.put("/api/engine/batching", json={"max_queue_size": 50}, headers=operator).get_json()
    assert partial == {"generation": 3, "batching": {**limits, "max_queue_size": 50}}
    back = client.put("/api/engine/batching", json={"max_batch_size": None}, headers=operator).get_json()
    assert back["batching"] == {"max_batch_size": 32, "max_queue_delay_ms": 7.5, "max_queue_size": 50}
    settle(app)
    assert batcher(app).max_batch_size == min(32, MLP_HINT) and batcher(app).max_queue_size == 50
    assert me(client)["generation"] == 4

    events = audit(app, "engine.batching")
    assert [(e.actor, e.outcome) for e in events] == [("otto", "ok")] * 3
    assert events[0].detail["changes"] == limits and events[0].detail["generation"] == 2


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"max_batch_size": 0},
        {"max_batch_size": 2.5},
        {"max_batch_size": True},
        {"max_queue_size": "9"},
        {"max_queue_delay_ms": -1},
        {"max_buffer": 3},
        [1, 2],
    ],
)
def test_a_bad_batching_body_is_refused_with_its_reason_and_changes_nothing(app, client, operator, body) -> None:
    response = client.put("/api/engine/batching", json=body, headers=operator)
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "bad_request" and response.get_json()["error"]["message"]
    assert client.get("/api/engine/desired").get_json()["generation"] == 1
    assert [e.outcome for e in audit(app, "engine.batching")] == ["error"]


def test_compaction_runs_once_per_request_in_each_process_and_reports(app, client, operator, monkeypatch) -> None:
    real = engine(app).compact_memory
    runs: list[dict] = []

    def counted() -> dict:
        runs.append(real())
        return runs[-1]

    monkeypatch.setattr(engine(app), "compact_memory", counted)
    settle(app)
    assert runs == [] and me(client)["compact_generation"] == 0 and me(client)["report"] is None

    response = client.post("/api/engine/compact", headers=operator)
    assert response.status_code == 202 and response.get_json() == {"compact_generation": 1}
    settle(app)
    settle(app)
    assert len(runs) == 1
    row = me(client)
    assert row["compact_generation"] == 1 and row["error"] == ""
    assert {"before", "after", "sessions", "heap_trimmed"} <= set(row["report"])
    assert [s["model"] for s in row["report"]["sessions"]] == ["mlp"]

    assert client.post("/api/engine/compact", headers=operator).get_json() == {"compact_generation": 2}
    settle(app)
    assert len(runs) == 2 and me(client)["compact_generation"] == 2
    assert client.get("/api/engine/desired").get_json()["generation"] == 1  # batching untouched
    assert [(e.actor, e.outcome) for e in audit(app, "engine.compact")] == [("otto", "ok")] * 2


def test_engine_status_is_refreshed_while_nothing_changes(app, client, monkeypatch) -> None:
    settle(app)
    first = me(client)["updated_at"]
    settle(app)
    assert me(client)["updated_at"] == first  # no write per pass
    monkeypatch.setattr(app.extensions["flightdeck"].reconciler, "heartbeat_s", 0.0)
    settle(app)
    assert me(client)["updated_at"] > first


def test_reload_keeps_serving_from_the_other_slot_and_restores_traffic(app, client, operator, monkeypatch) -> None:
    # v2 loaded into green as a candidate with no traffic; blue (v1) takes everything.
    assert client.post("/api/models/mlp/deploy", json={"version": "2"}, headers=operator).status_code == 202
    settle(app)
    assert engine(app).weights("mlp") == {"blue": 100, "green": 0}
    old_blue = next(v for v in engine(app).loaded("mlp") if v.slot == "blue")

    during: list[tuple[int, str | None, dict]] = []
    real_load = engine(app).load

    def load_and_probe(folder: Path, slot: str = "blue"):
        # While the slot reloads, its traffic is on the other slot: a request now is served by v2.
        response = app.test_client().post("/v2/models/mlp/infer", json=BODY)
        during.append((response.status_code, response.headers.get("X-Model-Version"), engine(app).weights("mlp")))
        return real_load(folder, slot)

    monkeypatch.setattr(engine(app), "load", load_and_probe)
    stop, seen = threading.Event(), []

    def traffic() -> None:
        own = app.test_client()
        while not stop.is_set():
            response = own.post("/v2/models/mlp/infer", json=BODY)
            seen.append((response.status_code, response.headers.get("X-Model-Version")))

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        response = client.post("/api/models/mlp/slots/blue/reload", headers=operator)
        assert response.status_code == 202, response.get_json()
        result = response.get_json()
        assert result == {"model": "mlp", "slot": "blue", "version": "1", "generation": result["generation"]}
        settle(app)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert during == [(200, "2", {"blue": 0, "green": 100})]
    assert seen and {status for status, _ in seen} == {200}, "a request failed during the reload"
    new_blue = next(v for v in engine(app).loaded("mlp") if v.slot == "blue")
    assert new_blue is not old_blue and new_blue.spec.version == "1" and new_blue.path == old_blue.path
    assert old_blue.batcher.close(0)  # the old session's executors have finished
    assert engine(app).weights("mlp") == {"blue": 100, "green": 0}
    assert infer(client).headers["X-Model-Version"] == "1"
    with app.extensions["flightdeck"].sessions() as session:
        status = session.get(SlotStatus, (app.extensions["flightdeck"].reconciler._process, "mlp", "blue"))
        assert (status.state, status.version, status.error, status.generation) == (
            "loaded",
            "1",
            "",
            result["generation"],
        )

    # The idle candidate slot reloads too (nothing to move), and again only once per request.
    assert client.post("/api/models/mlp/slots/green/reload", headers=operator).status_code == 202
    settle(app)
    settle(app)
    assert len(during) == 2 and during[1][2] == {"blue": 100, "green": 0}
    events = audit(app, "slot.reload")
    assert [(e.target, e.outcome) for e in events] == [("mlp:blue", "ok"), ("mlp:green", "ok")]


def test_a_reload_that_fails_its_golden_samples_leaves_the_other_slot_serving(
    app, client, operator, monkeypatch
) -> None:
    import serving.golden

    assert client.post("/api/models/mlp/deploy", json={"version": "2"}, headers=operator).status_code == 202
    settle(app)
    monkeypatch.setattr(serving.golden, "check_golden", lambda manifest, run: ["sample 0 differs"])
    generation = client.post("/api/models/mlp/slots/blue/reload", headers=operator).get_json()["generation"]
    settle(app)
    assert [v.slot for v in engine(app).loaded("mlp")] == ["green"]
    assert engine(app).weights("mlp") == {"blue": 0, "green": 100}
    assert infer(client).headers["X-Model-Version"] == "2"
    rows = client.get("/api/models/mlp/deployment").get_json()["processes"]
    blue = next(r for r in rows if r["slot"] == "blue")
    assert (blue["state"], blue["generation"]) == ("failed", generation) and "sample 0 differs" in blue["error"]

    # Asking again retries the load (in every process), and the desired weights come back.
    monkeypatch.undo()
    assert client.post("/api/models/mlp/slots/blue/reload", headers=operator).status_code == 202
    settle(app)
    assert engine(app).weights("mlp") == {"blue": 100, "green": 0}
    assert infer(client).headers["X-Model-Version"] == "1"


def test_lowering_the_batch_size_refuses_queued_requests_that_no_longer_fit(app) -> None:
    import numpy as np

    from serving.batching import Batcher
    from serving.errors import InvalidInput

    spec = engine(app).loaded("mlp")[0].spec
    gate = threading.Event()

    def run(inputs: dict) -> dict:
        gate.wait(10)
        return {t.name: np.zeros((inputs["input"].shape[0], 1), np.float32) for t in spec.outputs}

    def request(batch: int) -> tuple[dict, int, int]:
        tensors = {"input": np.zeros((batch, 64), np.float32)}
        return tensors, *spec.check_inputs(tensors, 8)

    batcher = Batcher(run, spec, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=100, instances=1)
    try:
        running = batcher.submit(*request(1), 10)
        deadline = time.monotonic() + 10
        while batcher.queue_depth or not batcher.busy:  # the executor took it and waits at the gate
            assert time.monotonic() < deadline
            time.sleep(0.001)
        too_big, small = batcher.submit(*request(4), 10), batcher.submit(*request(1), 10)
        assert batcher.reconfigure(max_batch_size=2, max_queue_delay_s=0.001, max_queue_size=3) == 1
        assert isinstance(too_big.future.exception(0), InvalidInput)
        assert (batcher.max_batch_size, batcher.max_queue_delay_s, batcher.max_queue_size) == (2, 0.001, 3)
        gate.set()
        assert batcher.result(running) and batcher.result(small)  # the executor lives on
        assert batcher.stats.rejected == 1 and batcher.stats.success == 2
        with pytest.raises(ValueError):
            batcher.reconfigure(max_batch_size=0, max_queue_delay_s=0.0, max_queue_size=3)
    finally:
        gate.set()
        assert batcher.close(10)


def test_reload_refuses_an_empty_slot_or_a_lone_live_one(app, client, operator) -> None:
    settle(app)  # blue holds v1 with all traffic; green is empty
    empty = client.post("/api/models/mlp/slots/green/reload", headers=operator)
    assert empty.status_code == 409 and "nothing in green" in empty.get_json()["error"]["message"]
    lone = client.post("/api/models/mlp/slots/blue/reload", headers=operator)
    assert lone.status_code == 409 and "green is empty" in lone.get_json()["error"]["message"]
    assert client.post("/api/models/mlp/slots/purple/reload", headers=operator).status_code == 404
    assert client.post("/api/models/nope/slots/blue/reload", headers=operator).status_code == 404
    deployment = client.get("/api/models/mlp/deployment").get_json()
    assert deployment["generation"] == 1  # nothing was written
    assert [(e.target, e.outcome) for e in audit(app, "slot.reload")] == [
        ("mlp:green", "error"),
        ("mlp:blue", "error"),
        ("mlp:purple", "error"),
        ("nope:blue", "error"),
    ]
    assert infer(client).status_code == 200


def test_the_engine_refuses_to_reload_a_lone_live_slot_itself(app) -> None:
    settle(app)
    with pytest.raises(ValueError, match="nothing would serve"):
        engine(app).reload("mlp", "blue")
    assert engine(app).weights("mlp") == {"blue": 100, "green": 0}


def test_changes_need_an_operator(app, client, viewer) -> None:
    writes = [
        ("put", "/api/engine/batching", {"max_queue_size": 4}),
        ("post", "/api/engine/compact", None),
        ("post", "/api/models/mlp/slots/blue/reload", None),
    ]
    for method, path, body in writes:
        anonymous = getattr(client, method)(path, json=body)
        assert anonymous.status_code == 401, path
        assert anonymous.get_json()["error"]["code"]
        assert getattr(client, method)(path, json=body, headers=viewer).status_code == 403, path
    assert client.get("/api/engine/desired").status_code == 200  # reads are open in these tests (app_config)
    desired = client.get("/api/engine/desired").get_json()
    assert desired["generation"] == 1 and desired["compact_generation"] == 0
    for action in ("engine.batching", "engine.compact", "slot.reload"):
        assert {e.outcome for e in audit(app, action)} == {"denied"}, action


def test_a_process_that_stops_leaves_the_engine_status(app, client) -> None:
    settle(app)
    services = app.extensions["flightdeck"]
    assert len(client.get("/api/engine/desired").get_json()["processes"]) == 1
    services.reconciler.stop()
    with services.sessions() as session:
        assert list(session.scalars(select(EngineStatus))) == []


@pytest.mark.slow
def test_the_runbooks_change_every_worker_of_the_real_server(home: Path) -> None:
    token = operator_token(home)
    server = start_server(home, {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_WORKERS": "2"})
    port = int(server.url.rsplit(":", 1)[1])
    env = {"FLIGHTDECK_URL": server.url, "FLIGHTDECK_TOKEN": token}
    try:
        # Ready means one worker answers; wait until both have reported their engine state once.
        deadline = time.monotonic() + 60
        while len(call(port, "GET", "/api/engine/desired", token)["processes"]) < 2:
            assert time.monotonic() < deadline, "the second worker never reported"
            time.sleep(0.1)
        done = run_script(RUNBOOKS / "set_batching.py", "--max-batch-size", "8", "--max-queue-delay-ms", "1.5", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        steps = step_lines(done.stdout)
        assert [s["status"] for s in steps] == ["ok", "ok", "ok"], steps
        assert steps[2]["detail"]["summary"] == "2 serving process(es) applied generation 2"
        desired = call(port, "GET", "/api/engine/desired", token)
        assert desired["batching"] == {"max_batch_size": 8, "max_queue_delay_ms": 1.5, "max_queue_size": 128}
        assert [p["generation"] for p in desired["processes"]] == [2, 2]

        done = run_script(RUNBOOKS / "compact_memory.py", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        confirm = step_lines(done.stdout)[2]
        assert confirm["status"] == "ok" and len(confirm["detail"]["processes"]) == 2
        assert all(p["report"]["sessions"][0]["model"] == "mlp" for p in confirm["detail"]["processes"])

        done = run_script(RUNBOOKS / "shed_load.py", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert call(port, "GET", "/api/engine/desired", token)["batching"]["max_queue_size"] == 64

        # drain_reload as the server runs it (a second operator approved it): v2 waits in green first.
        call(port, "POST", "/api/models/mlp/deploy", token, {"version": "2", "pause_s": 600})
        reload_env = {**env, "FLIGHTDECK_RUNBOOK_RUN": "1"}
        traffic = Traffic(port, clients=2)
        try:
            done = run_script(RUNBOOKS / "drain_reload.py", "--model", "mlp", "--slot", "blue", env=reload_env)
            assert done.returncode == 0, done.stdout + done.stderr
            steps = step_lines(done.stdout)
            assert [s["status"] for s in steps] == ["ok", "ok", "ok"], steps
            assert "reloaded blue (version 1) and verified it" in steps[2]["detail"]
            # NOTE: the script's verify step is content with the processes that reached the generation so
            # far; wait here until both workers have reloaded, with traffic still flowing.
            generation = int(steps[1]["detail"].rsplit(" ", 1)[1])
            deadline = time.monotonic() + 60
            while True:
                rows = call(port, "GET", "/api/models/mlp/deployment", token)["processes"]
                blue = [r for r in rows if r["slot"] == "blue" and r["generation"] >= generation]
                if len(blue) == 2 and {r["state"] for r in blue} == {"loaded"}:
                    break
                assert time.monotonic() < deadline, rows
                time.sleep(0.05)
        finally:
            traffic.close()
        assert traffic.seen and {s for _, s, _ in traffic.seen} == {200}, "a request failed during the reload"
        assert "Traceback" not in server.output()
    finally:
        assert server.stop() == 0
