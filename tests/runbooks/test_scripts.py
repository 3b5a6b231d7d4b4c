"""The scripts from a shell, against a stand-in HTTP server on 127.0.0.1.

The stand-in serves the endpoints these runbooks need that the real server lacks so far: the engine
desired state (PUT /api/engine/batching, POST /api/engine/compact, GET /api/engine/desired) and the
slot reload (POST /api/models/{name}/slots/{slot}/reload). Rollback and diagnostics also run against
the real server in test_server.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runbooks.conftest import RUNBOOKS, run_script, step_lines
from tests.runbooks.fakeapi import FakeApi, engine_desired_state, openapi

TOKEN = "fd_test-token"
DRY_RUNS = {
    "rollback.py": ["--model", "textcls"],
    "drain_reload.py": ["--model", "textcls", "--slot", "green"],
    "compact_memory.py": [],
    "set_batching.py": ["--max-batch-size", "8", "--max-queue-delay-ms", "1.5"],
    "shed_load.py": ["--max-queue-size", "64"],
    "diagnostics.py": ["--out", "snap.json"],
    "check_drift.py": ["--model", "magika"],
}


def env(fake: FakeApi, **extra: str) -> dict[str, str]:
    return {"FLIGHTDECK_URL": fake.url, "FLIGHTDECK_TOKEN": TOKEN, **extra}


@pytest.mark.parametrize("script", sorted(DRY_RUNS))
def test_a_dry_run_prints_its_plan_and_does_nothing(script: str, fake_api: FakeApi, tmp_path: Path) -> None:
    done = run_script(RUNBOOKS / script, *DRY_RUNS[script], "--dry-run", env=env(fake_api), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = step_lines(done.stdout)
    assert steps and {s["status"] for s in steps} == {"dry-run"}
    assert all(isinstance(s["detail"], list) and s["detail"] for s in steps)
    assert fake_api.seen == []  # not even a GET
    assert list(tmp_path.iterdir()) == []  # no file written


def test_a_dry_run_names_the_calls_it_would_make(fake_api: FakeApi) -> None:
    done = run_script(RUNBOOKS / "rollback.py", "--model", "textcls", "--dry-run", env=env(fake_api))
    assert step_lines(done.stdout)[0] == {
        "step": "rollback",
        "status": "dry-run",
        "detail": ["would POST /api/models/textcls/rollback"],
    }


def test_set_batching_writes_desired_state_and_waits_for_every_process(fake_api: FakeApi) -> None:
    fake_api.routes.update(engine_desired_state(processes=2))
    done = run_script(
        RUNBOOKS / "set_batching.py", "--max-batch-size", "8", "--max-queue-delay-ms", "1.5", env=env(fake_api)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(s["step"], s["status"]) for s in step_lines(done.stdout)] == [
        ("check", "ok"),
        ("apply", "ok"),
        ("confirm", "ok"),
    ]
    put = next(s for s in fake_api.seen if s.method == "PUT")
    assert put.path == "/api/engine/batching" and put.body == {"max_batch_size": 8, "max_queue_delay_ms": 1.5}
    assert {s.authorization for s in fake_api.seen} == {f"Bearer {TOKEN}"}
    assert "2 serving process(es) applied generation 2" in step_lines(done.stdout)[2]["detail"]["summary"]


def test_shed_load_halves_the_queue_limit_by_default_and_never_raises_it(fake_api: FakeApi) -> None:
    fake_api.routes.update(engine_desired_state(max_queue_size=128))
    done = run_script(RUNBOOKS / "shed_load.py", env=env(fake_api))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [s.body for s in fake_api.seen if s.method == "PUT"] == [{"max_queue_size": 64}]
    raised = run_script(RUNBOOKS / "shed_load.py", "--max-queue-size", "100", env=env(fake_api))
    assert raised.returncode == 1
    steps = step_lines(raised.stdout)
    assert steps[0]["status"] == "failed" and "would not shed load" in steps[0]["detail"]
    assert [s["status"] for s in steps[1:]] == ["skipped", "skipped"]
    assert len([s for s in fake_api.seen if s.method == "PUT"]) == 1  # the refused run changed nothing


def test_compact_memory_requests_compaction_and_reports_each_process(fake_api: FakeApi) -> None:
    fake_api.routes.update(engine_desired_state(processes=3))
    done = run_script(RUNBOOKS / "compact_memory.py", env=env(fake_api))
    assert done.returncode == 0, done.stdout + done.stderr
    confirm = step_lines(done.stdout)[2]["detail"]
    assert len(confirm["processes"]) == 3 and confirm["processes"][0]["report"] == {"freed_bytes": 4096}


def test_a_missing_endpoint_fails_clearly_and_changes_nothing(fake_api: FakeApi) -> None:
    fake_api.routes[("GET", "/api/openapi.json")] = openapi(("GET", "/api/engine"))  # today's server
    done = run_script(RUNBOOKS / "compact_memory.py", env=env(fake_api))
    assert done.returncode == 1
    check = step_lines(done.stdout)[0]
    assert check["status"] == "failed"
    assert "has no POST /api/engine/compact endpoint, which this runbook needs; nothing was changed" in check["detail"]
    assert [s.method for s in fake_api.seen] == ["GET"]


def test_diagnostics_writes_one_file_even_when_a_part_fails(fake_api: FakeApi, tmp_path: Path) -> None:
    fake_api.routes.update(
        {
            ("GET", "/api/engine"): lambda _: (200, {"ready": True, "models": []}),
            ("GET", "/metrics"): lambda _: (200, 'flightdeck_gpu_utilization_ratio{gpu="0"} 0.5\nother 1\n'),
            ("GET", "/api/history/summary"): lambda _: (500, {"error": {"code": "internal", "message": "boom"}}),
            ("GET", "/api/audit"): lambda _: (200, {"events": [{"action": "rollout.start"}]}),
        }
    )
    done = run_script(
        RUNBOOKS / "diagnostics.py", "--out", "snap.json", env=env(fake_api, FLIGHTDECK_OUTPUT_DIR=str(tmp_path))
    )
    assert done.returncode == 0, done.stdout + done.stderr
    statuses = {s["step"]: s["status"] for s in step_lines(done.stdout)}
    assert statuses == {
        "engine": "ok",
        "metrics": "ok",
        "history": "failed",
        "deploys": "ok",
        "errors": "ok",
        "write": "ok",
    }
    snapshot = json.loads((tmp_path / "snap.json").read_text())
    assert snapshot["engine"]["ready"] is True
    assert snapshot["metrics"]["gpu"] == ['flightdeck_gpu_utilization_ratio{gpu="0"} 0.5']
    assert "answered 500: boom" in snapshot["history"]["error"]
    audits = sorted(s.path for s in fake_api.seen if s.path.startswith("/api/audit"))
    assert audits == ["/api/audit?action=rollout.*&limit=20", "/api/audit?outcome=error&limit=20"]


def test_diagnostics_refuses_a_path_for_its_file(fake_api: FakeApi) -> None:
    for out in ("../../etc/passwd.json", "/tmp/x.json", "snap.txt"):
        done = run_script(RUNBOOKS / "diagnostics.py", "--out", out, env=env(fake_api))
        assert done.returncode == 2 and "does not match" in done.stderr
    assert fake_api.seen == []


def test_a_dangerous_runbook_from_a_shell_asks_the_server_for_a_second_operator(fake_api: FakeApi) -> None:
    fake_api.routes[("POST", "/api/runbooks/drain_reload/runs")] = lambda body: (
        202,
        {"id": 7, "state": "awaiting_approval"},
    )
    done = run_script(RUNBOOKS / "drain_reload.py", "--model", "textcls", "--slot", "green", env=env(fake_api))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"run": 7, "state": "awaiting_approval"}
    assert "a second operator approves it with POST /api/runbooks/runs/7/approve" in done.stderr
    assert [(s.method, s.path, s.body) for s in fake_api.seen] == [
        ("POST", "/api/runbooks/drain_reload/runs", {"params": {"model": "textcls", "slot": "green"}})
    ]


def test_drain_reload_run_by_the_server_reloads_the_slot_and_waits_for_every_process(fake_api: FakeApi) -> None:
    state = {"generation": 4}

    def deployment(_body) -> tuple[int, dict]:
        rows = [{"process": f"h:{i}", "slot": "green", "version": "2", "state": "loaded", "error": "",
                 "generation": state["generation"]} for i in range(2)]  # fmt: skip
        slots = {"blue": {"version": "1", "weight": 90}, "green": {"version": "2", "weight": 10}}
        return 200, {"model": "textcls", "slots": slots, "generation": state["generation"], "processes": rows}

    def reload(_body) -> tuple[int, dict]:
        state["generation"] += 1
        return 202, {"model": "textcls", "slot": "green", "version": "2", "generation": state["generation"]}

    fake_api.routes.update(
        {
            ("GET", "/api/openapi.json"): openapi(("POST", "/api/models/{name}/slots/{slot}/reload")),
            ("GET", "/api/models/textcls/deployment"): deployment,
            ("POST", "/api/models/textcls/slots/green/reload"): reload,
        }
    )
    args = ("--model", "textcls", "--slot", "green")
    done = run_script(RUNBOOKS / "drain_reload.py", *args, env=env(fake_api, FLIGHTDECK_RUNBOOK_RUN="3"))
    assert done.returncode == 0, done.stdout + done.stderr
    steps = step_lines(done.stdout)
    assert [s["status"] for s in steps] == ["ok", "ok", "ok"]
    assert steps[2]["detail"] == "2 process(es) reloaded green (version 2) and verified it"


def test_bad_arguments_stop_before_any_request(fake_api: FakeApi) -> None:
    cases = [
        ("rollback.py", ["--model", "textcls;reboot"]),
        ("rollback.py", ["--model=-x"]),
        ("rollback.py", []),
        ("set_batching.py", ["--max-batch-size", "0", "--max-queue-delay-ms", "1"]),
        ("set_batching.py", ["--max-batch-size", "1e3", "--max-queue-delay-ms", "1"]),
        ("drain_reload.py", ["--model", "textcls", "--slot", "purple"]),
        ("rollback.py", ["--model", "textcls", "--from-step", "nowhere"]),
        ("rollback.py", ["--mod", "textcls"]),  # no abbreviations
    ]
    for script, args in cases:
        done = run_script(RUNBOOKS / script, *args, env=env(fake_api))
        assert done.returncode == 2, (script, args, done.stdout)
    assert fake_api.seen == []


def test_without_a_token_the_step_says_how_to_give_one(fake_api: FakeApi) -> None:
    fake_api.routes[("POST", "/api/models/textcls/rollback")] = lambda _: (
        401,
        {"error": {"code": "unauthorized", "message": "authentication required"}},
    )
    done = run_script(RUNBOOKS / "rollback.py", "--model", "textcls", env={"FLIGHTDECK_URL": fake_api.url})
    assert done.returncode == 1
    first, second = step_lines(done.stdout)
    assert first["detail"] == (
        "POST /api/models/textcls/rollback answered 401: authentication required (set FLIGHTDECK_TOKEN to an API token)"
    )
    assert second == {"step": "verify", "status": "skipped", "detail": "an earlier step failed"}
    assert fake_api.seen[0].authorization is None


def test_from_step_skips_the_steps_before_it(fake_api: FakeApi) -> None:
    fake_api.routes.update(engine_desired_state())
    done = run_script(RUNBOOKS / "compact_memory.py", "--from-step", "confirm", env=env(fake_api))
    assert done.returncode == 0, done.stdout
    assert [s["status"] for s in step_lines(done.stdout)] == ["skipped", "skipped", "ok"]
    assert not any(s.method == "POST" for s in fake_api.seen)


def test_alert_commands_spell_flags_with_underscores(fake_api: FakeApi) -> None:
    # The alert evaluator prints `python runbooks/shed_load.py --max_queue_size 64`; that works too.
    done = run_script(RUNBOOKS / "shed_load.py", "--max_queue_size", "64", "--dry-run", env=env(fake_api))
    assert done.returncode == 0 and '{\\"max_queue_size\\": 64}' in done.stdout


def test_check_drift_says_what_moved_and_what_to_check(fake_api: FakeApi) -> None:
    def score(kind: str, name: str, value: float | None, **extra: float) -> dict:
        return {"kind": kind, "name": name, "score": value, "samples": 120, "reference_samples": 160, **extra}

    reference = {"start": "2026-12-01T00:00:00+00:00", "end": "2026-12-02T00:00:00+00:00", "source": "first_day"}
    drift = {
        "model": "magika",
        "versions": [
            {
                "version": "1",
                "reference": reference,
                "scores": [
                    score("predictions", "target_label", 0.92),
                    score("input", "bytes", 0.41, mean=131.0, reference_mean=96.5),
                ],
            }
        ],
    }
    events = [{"ts": "2026-12-02T09:00:00+00:00", "action": "rollout.start", "actor": "otto", "target": "magika",
               "outcome": "ok"}, {"ts": "x", "action": "rollout.start", "actor": "a", "target": "mlp", "outcome": "ok"}]  # fmt: skip
    fake_api.routes[("GET", "/api/models/magika/drift")] = lambda body: (200, drift)
    fake_api.routes[("GET", "/api/audit")] = lambda body: (200, {"events": events})
    done = run_script(RUNBOOKS / "check_drift.py", "--model", "magika", env=env(fake_api))
    assert done.returncode == 0, done.stdout + done.stderr
    steps = {s["step"]: s for s in step_lines(done.stdout)}
    assert {s["status"] for s in steps.values()} == {"ok"}, steps
    said = steps["scores"]["detail"]
    assert "v1 predictions:target_label: 0.920 bits" in said and "mean 96.5 -> 131" in said
    assert "callers send different data" in said and "its first day serving" in said
    assert "rollout.start by otto" in str(steps["deploys"]["detail"]) and "mlp" not in str(steps["deploys"]["detail"])
    assert [s.path.split("?")[0] for s in fake_api.seen] == ["/api/models/magika/drift", "/api/audit"]
