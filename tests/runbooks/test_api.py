"""The runbook API over the real app: the server runs registered scripts that call it back with their own token.

The app is served on 127.0.0.1 (a free port) by werkzeug in a thread, so a script the runner starts
talks to this very app over HTTP; the test drives the API with Flask's test client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import select
from werkzeug.serving import make_server

from controlplane.auth import Role
from controlplane.auth import users as user_service
from controlplane.context import app_services
from controlplane.models import ApiToken, AuditEvent, Base
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.catalog import RunbookCatalog
from controlplane.runbooks.runner import RunbookRunner
from tests.runbooks.conftest import token_for

WAIT_S = 60


@pytest.fixture
def app_config(home: Path) -> dict:
    return {
        "home": str(home),
        "scheduler": False,
        "log_sample_rate": 0.0,
        "load_models": "mlp",
        "warmup_max_sequence": 16,
        "auth_reads": False,  # reading runs back needs no token here; tests/controlplane/auth covers access
    }


@pytest.fixture
def app(app_config: dict, runbooks_dir: Path, tmp_path: Path, shared_sessions: None) -> Iterator[Flask]:
    """The app served on 127.0.0.1, its services' runner over the test's runbooks folder."""
    from controlplane.app import create_app

    application = create_app(app_config)
    application.testing = True
    services = app_services(application)
    Base.metadata.create_all(services.db, tables=[RunbookRun.__table__])  # a no-op once 0008 is at head
    server = make_server("127.0.0.1", 0, application, threaded=True)
    runner = RunbookRunner(
        RunbookCatalog(runbooks_dir), services.sessions, api_url=f"http://127.0.0.1:{server.port}",
        output_dir=tmp_path / "out",
    )  # fmt: skip
    # NOTE: the API and the console use the composition root's runner; this one runs the test's scripts.
    services.runbooks.shutdown()
    services.runbooks = runner
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield application
    runner.shutdown()
    server.shutdown()
    thread.join(10)
    services.shutdown(5)


@pytest.fixture
def tokens(app: Flask) -> dict[str, dict[str, str]]:
    return {
        "otto": token_for(app, "otto", Role.OPERATOR),
        "olga": token_for(app, "olga", Role.OPERATOR),
        "vic": token_for(app, "vic", Role.VIEWER),
    }


def runner_of(app: Flask) -> RunbookRunner:
    return app_services(app).runbooks


def finished(app: Flask, client, run_id: int, headers: dict) -> dict:
    assert runner_of(app).wait(run_id, WAIT_S), f"run {run_id} did not finish"
    return client.get(f"/api/runbooks/runs/{run_id}", headers=headers).get_json()


def audit(app: Flask, prefix: str = "") -> list[AuditEvent]:
    with app.extensions["flightdeck"].sessions() as session:
        return [e for e in session.scalars(select(AuditEvent).order_by(AuditEvent.id)) if e.action.startswith(prefix)]


def test_the_registered_runbooks_and_their_declarations(client, tokens) -> None:
    listed = client.get("/api/runbooks").get_json()
    names = {r["name"] for r in listed["runbooks"]}
    assert {"rollback", "drain_reload", "compact_memory", "set_batching", "shed_load", "diagnostics"} <= names
    assert listed["invalid"] == []
    rollback = client.get("/api/runbooks/rollback").get_json()
    assert rollback["params"]["model"]["required"] is True and rollback["dangerous"] is False
    missing = client.get("/api/runbooks/nope")
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"


def test_a_run_calls_the_api_back_with_a_scoped_token_that_dies_with_it(app, client, tokens) -> None:
    started = client.post("/api/runbooks/whoami/runs", json={}, headers=tokens["otto"])
    assert started.status_code == 202, started.get_json()
    run = finished(app, client, started.get_json()["id"], tokens["otto"])
    assert run["state"] == "succeeded" and run["trigger"] == "person" and run["requested_by"] == "otto"
    who = run["steps"][0]["detail"]
    assert (who["user"], who["role"], who["kind"]) == ("otto", "viewer", "token")
    with app.extensions["flightdeck"].sessions() as session:
        token = session.get(ApiToken, who["token_id"])
        assert token.name == f"runbook-{run['id']}" and token.revoked_at is not None


def test_rollback_through_the_server_reaches_the_real_rollout_service(app, client, tokens) -> None:
    started = client.post("/api/runbooks/rollback/runs", json={"params": {"model": "mlp"}}, headers=tokens["otto"])
    run = finished(app, client, started.get_json()["id"], tokens["otto"])
    # mlp has never been rolled out, so the real service refuses, and the run says why.
    assert run["state"] == "failed"
    assert "answered 409: model 'mlp' has no earlier stable version to roll back to" in run["error"]
    assert [e.action for e in audit(app, "runbook.")] == ["runbook.request", "runbook.start", "runbook.finish"]


def test_refusals_come_in_the_envelope_and_are_audited(client, tokens) -> None:
    cases = [
        (tokens["vic"], "rollback", {"params": {"model": "mlp"}}, 403, "forbidden"),
        (tokens["otto"], "rollback", {"params": {"model": "mlp; reboot"}}, 400, "bad_arguments"),
        (tokens["otto"], "rollback", {"params": {"model": "mlp"}, "shell": True}, 400, "bad_request"),
        (tokens["otto"], "rollback", {"params": {"model": "mlp"}, "dry_run": "yes"}, 400, "bad_request"),
        (tokens["otto"], "rollback", {"params": {"model": "mlp"}, "from_step": "$(id)"}, 400, "bad_arguments"),
        (tokens["otto"], "nope", {}, 404, "not_found"),
        ({}, "rollback", {"params": {"model": "mlp"}}, 401, "unauthorized"),
    ]
    for headers, name, body, status, code in cases:
        response = client.post(f"/api/runbooks/{name}/runs", json=body, headers=headers)
        assert response.status_code == status, (body, response.get_json())
        assert response.get_json()["error"]["code"] == code and response.get_json()["error"]["request_id"]
    assert client.get("/api/runbooks/runs", headers=tokens["otto"]).get_json()["runs"] == []


def test_refused_requests_leave_audit_events(app, client, tokens) -> None:
    client.post("/api/runbooks/rollback/runs", json={"params": {"model": "mlp; reboot"}}, headers=tokens["otto"])
    client.post("/api/runbooks/rollback/runs", json={"params": {"model": "mlp"}}, headers=tokens["vic"])
    [bad, denied] = audit(app, "runbook.")
    assert (bad.actor, bad.outcome) == ("otto", "error") and "must match" in bad.detail["error"]
    assert (denied.actor, denied.outcome) == ("vic", "denied")


def test_the_two_person_rule_over_http(app, client, tokens) -> None:
    asked = client.post("/api/runbooks/danger/runs", json={"params": {"model": "mlp"}}, headers=tokens["otto"])
    assert asked.status_code == 202 and asked.get_json()["state"] == "awaiting_approval"
    run_id = asked.get_json()["id"]
    own = client.post(f"/api/runbooks/runs/{run_id}/approve", headers=tokens["otto"])
    assert own.status_code == 403 and "two-person rule" in own.get_json()["error"]["message"]
    assert client.post(f"/api/runbooks/runs/{run_id}/approve", headers=tokens["vic"]).status_code == 403
    approved = client.post(f"/api/runbooks/runs/{run_id}/approve", headers=tokens["olga"])
    assert approved.status_code == 200 and approved.get_json()["approved_by"] == "olga"
    run = finished(app, client, run_id, tokens["olga"])
    assert run["state"] == "succeeded" and run["steps"][0]["detail"] == "changed mlp"
    again = client.post(f"/api/runbooks/runs/{run_id}/approve", headers=tokens["olga"])
    assert again.status_code == 409
    denied = [e for e in audit(app, "runbook.approve") if e.outcome == "denied"]
    assert [e.actor for e in denied] == ["otto", "vic"]


def test_a_failed_run_resumes_at_its_failed_step_over_http(app, client, tokens, tmp_path) -> None:
    marker = tmp_path / "marker"
    started = client.post("/api/runbooks/steps/runs", json={"params": {"marker": str(marker)}}, headers=tokens["otto"])
    failed = finished(app, client, started.get_json()["id"], tokens["otto"])
    assert failed["state"] == "failed" and [s["status"] for s in failed["steps"]] == [
        "ok",
        "failed",
        "failed",
        "skipped",
    ]
    marker.touch()
    resumed = client.post(f"/api/runbooks/runs/{failed['id']}/resume", headers=tokens["olga"])
    assert resumed.status_code == 202 and resumed.get_json()["from_step"] == "needs_marker"
    run = finished(app, client, resumed.get_json()["id"], tokens["olga"])
    assert run["state"] == "succeeded" and run["resumed_from"] == failed["id"] and run["requested_by"] == "olga"
    listed = client.get("/api/runbooks/runs?runbook=steps&limit=1").get_json()["runs"]
    assert [r["id"] for r in listed] == [run["id"]] and "output" not in listed[0]
    for query in ("limit=0", "limit=x", "state=bogus"):
        assert client.get(f"/api/runbooks/runs?{query}").status_code == 400


def test_a_run_from_the_console_is_recorded_as_such(app, client) -> None:
    with app.extensions["flightdeck"].sessions() as session:
        user_service.create_user(session, "cora", "a-long-password-1", Role.OPERATOR, datetime.now(UTC))
        session.commit()
    csrf = client.post("/api/session", json={"name": "cora", "password": "a-long-password-1"}).get_json()["csrf_token"]
    refused = client.post("/api/runbooks/echo/runs", json={"params": {"text": "hi"}})
    assert refused.status_code == 403  # a cookie alone is not enough for a write: CSRF
    started = client.post("/api/runbooks/echo/runs", json={"params": {"text": "hi"}}, headers={"X-CSRF-Token": csrf})
    assert started.status_code == 202 and started.get_json()["trigger"] == "console"
    assert finished(app, client, started.get_json()["id"], {})["state"] == "succeeded"


def test_a_dry_run_over_http_shows_the_plan(app, client, tokens) -> None:
    body = {"params": {"model": "mlp", "slot": "green"}, "dry_run": True}
    started = client.post("/api/runbooks/drain_reload/runs", json=body, headers=tokens["otto"])
    assert started.status_code == 202 and started.get_json()["dry_run"] is True  # no second operator for a dry run
    run = finished(app, client, started.get_json()["id"], tokens["otto"])
    assert run["state"] == "succeeded" and {s["status"] for s in run["steps"]} == {"dry-run"}
    assert run["steps"][1]["detail"] == ["would POST /api/models/mlp/slots/green/reload"]


def test_a_body_that_does_not_fit_is_refused_by_name_and_audited(app, client, tokens) -> None:
    cases = [
        ({"params": {"model": "mlp"}, "shell": True}, "unknown field(s) ['shell']"),
        ({"params": {"model": "mlp"}, "from_step": 2}, "'from_step' must be a string"),
        ({"params": {"model": "mlp"}, "dry_run": "yes"}, "'dry_run' must be true or false"),
        ({"params": ["mlp"]}, "'params' must be an object"),
    ]
    for body, message in cases:
        response = client.post("/api/runbooks/rollback/runs", json=body, headers=tokens["otto"])
        assert response.status_code == 400 and message in response.get_json()["error"]["message"], body
    rejected = client.post("/api/runbooks/runs/1/reject", json={"why": "no"}, headers=tokens["otto"])
    assert rejected.status_code == 400 and "['why']" in rejected.get_json()["error"]["message"]
    events = audit(app, "runbook.")
    assert [(e.action, e.actor, e.outcome) for e in events] == [("runbook.request", "otto", "error")] * 4 + [
        ("runbook.reject", "otto", "error")
    ]
    assert "'shell'" in events[0].detail["error"] and events[4].target == "1"
    assert client.get("/api/runbooks/runs", headers=tokens["otto"]).get_json()["runs"] == []


def test_declarations_and_queries_answer_as_before(app, client, tokens) -> None:
    for name in ("rollback", "set_batching", "steps"):
        declared = json.loads(json.dumps(runner_of(app).catalog.get(name).to_dict()))
        assert client.get(f"/api/runbooks/{name}").get_json() == declared  # no key added, none as null
    assert client.get("/api/runbooks/runs?state=&runbook=").status_code == 200  # an empty select filters nothing
    too_many = client.get("/api/runbooks/runs?limit=501").get_json()["error"]["message"]
    assert too_many == "'limit' must be a whole number from 1 to 500; got '501'"
    state = client.get("/api/runbooks/runs?state=bogus").get_json()["error"]["message"]
    assert "'state' must be one of" in state and "awaiting_approval" in state
