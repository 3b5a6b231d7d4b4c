"""Rollouts end to end in one process: real engine, real SQLite, real history, real auth."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select

from controlplane.models import AuditEvent

BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}


def versions_served(client, n: int = 60) -> Counter:
    seen = Counter()
    for _ in range(n):
        response = client.post("/v2/models/mlp/infer", json=BODY)
        assert response.status_code == 200, response.get_json()
        seen[response.headers["X-Model-Version"]] += 1
    return seen


def settle(app) -> None:
    """Let this process converge now (the reconciler thread would within its poll interval)."""
    app.extensions["flightdeck"].reconciler.reconcile()


def advance(app) -> list[str]:
    services = app.extensions["flightdeck"]
    services.sampler.sample()  # the analysis reads the history, so write what happened
    events = services.advance_rollouts()
    settle(app)
    return events


def deploy(client, operator, **body) -> dict:
    response = client.post("/api/models/mlp/deploy", json=body, headers=operator)
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def test_canary_steps_through_analysis_to_success_then_one_click_rollback(app, client, operator) -> None:
    assert versions_served(client, 10) == {"1": 10}
    # Sub-millisecond p99s of a hundred requests are noise on a shared CPU: this test is about the flow.
    policy = {"min_requests": 20}
    rollout = deploy(client, operator, version="2", steps=[50, 100], pause_s=0, policy=policy)
    assert rollout["state"] == "loading" and rollout["candidate_slot"] == "green"
    settle(app)  # loads v2 into green and checks its golden samples; traffic unchanged
    assert versions_served(client, 10) == {"1": 10}
    assert advance(app) == [f"{rollout['id']}: loaded -> progressing"]
    split = versions_served(client, 200)
    assert 60 < split["2"] < 140 and split["1"] + split["2"] == 200  # the 50% step
    events = advance(app)
    assert events == [f"{rollout['id']}: pass -> succeeded"]
    assert versions_served(client, 20) == {"2": 20}
    detail = client.get(f"/api/rollouts/{rollout['id']}").get_json()
    assert detail["state"] == "succeeded" and detail["measurements"][0]["verdict"] == "pass"
    assert detail["measurements"][0]["figures"]["requests"] >= 60
    evidence = {e["check"]: e for e in detail["measurements"][0]["evidence"]}
    assert evidence["window"]["seconds"] > 0 and not evidence["window"]["early"]
    latency = evidence["latency"]
    assert latency["outcome"] == "pass" and latency["samples"]["batch_sizes"] == [1]
    assert latency["samples"]["candidate_batches"] >= 60 and 0 <= latency["p_value"] <= 1
    labels = evidence["labels:probabilities"]  # v1 and v2 answer this one input with their own top class
    assert labels["samples"]["candidate"] >= 60 and labels["effect"]["js_divergence"] is not None

    back = client.post("/api/models/mlp/rollback", headers=operator)
    assert back.status_code == 200 and back.get_json() == {**back.get_json(), "version": "1", "reloaded": False}
    settle(app)
    assert versions_served(client, 20) == {"1": 20}  # v1 was still loaded: traffic moved at once
    again = client.post("/api/models/mlp/rollback", headers=operator)
    assert again.status_code == 409 and "already serves version 1" in again.get_json()["error"]["message"]


def test_a_failing_canary_rolls_back_by_itself_and_records_why(app, client, operator) -> None:
    rollout = deploy(
        client, operator, version="2", steps=[25, 100], pause_s=0, policy={"min_requests": 10, "slo_p99_ms": 0.001}
    )
    settle(app)
    advance(app)
    versions_served(client, 120)
    assert advance(app) == [f"{rollout['id']}: fail -> rolled_back"]
    assert versions_served(client, 20) == {"1": 20}
    detail = client.get(f"/api/rollouts/{rollout['id']}").get_json()
    assert detail["state"] == "rolled_back" and "over the SLO" in detail["reason"]
    assert detail["measurements"][0]["verdict"] == "fail"
    deployment = client.get("/api/models/mlp/deployment").get_json()
    assert deployment["slots"]["green"] == {"version": None, "weight": 0}  # not retried by itself
    with app.extensions["flightdeck"].sessions() as session:
        events = list(session.scalars(select(AuditEvent).order_by(AuditEvent.id)))
    assert "rollout.start" in [e.action for e in events]
    (rolled,) = [e for e in events if e.action == "rollout.auto_rollback"]
    assert (rolled.actor, rolled.detail["verdict"], rolled.detail["step"]) == ("system", "fail", 1)
    assert "over the SLO" in rolled.detail["reasons"][0] and rolled.detail["figures"]["requests"] > 0


def test_too_little_traffic_pauses_for_a_person_who_can_promote_all(app, client, operator) -> None:
    rollout = deploy(client, operator, version="2", steps=[10, 50, 100], pause_s=0, policy={"min_requests": 1000})
    settle(app)
    advance(app)
    versions_served(client, 30)
    assert advance(app) == [f"{rollout['id']}: inconclusive -> paused"]
    assert advance(app) == []  # paused stays paused: never promotes silently
    with app.extensions["flightdeck"].sessions() as session:
        paused = session.scalars(select(AuditEvent).where(AuditEvent.action == "rollout.auto_pause")).one()
    assert (paused.actor, paused.detail["verdict"]) == ("system", "inconclusive")
    promoted = client.post(f"/api/rollouts/{rollout['id']}/promote_all", headers=operator)
    assert promoted.status_code == 200 and promoted.get_json()["state"] == "succeeded"
    settle(app)
    assert versions_served(client, 10) == {"2": 10}


def test_abort_returns_traffic_and_finished_rollouts_refuse_actions(app, client, operator) -> None:
    rollout = deploy(client, operator, version="2", steps=[50, 100], pause_s=3600)
    settle(app)
    advance(app)
    aborted = client.post(f"/api/rollouts/{rollout['id']}/abort", headers=operator)
    assert aborted.status_code == 200 and aborted.get_json()["state"] == "aborted"
    settle(app)
    assert versions_served(client, 20) == {"1": 20}
    refused = client.post(f"/api/rollouts/{rollout['id']}/resume", headers=operator)
    assert refused.status_code == 409 and "has finished" in refused.get_json()["error"]["message"]


def test_bad_requests_and_roles(app, client, operator, viewer) -> None:
    assert client.post("/api/models/mlp/deploy", json={"version": "2"}).status_code == 401
    assert client.post("/api/models/mlp/deploy", json={"version": "2"}, headers=viewer).status_code == 403
    cases = [
        ({"version": "1"}, 409, "already the stable version"),
        ({}, 400, "'version' must be"),
        ({"version": "2", "strategy": "yolo"}, 400, "'strategy' must be"),
        ({"version": "2", "steps": [50, 20, 100]}, 400, "'steps' must rise to 100"),
        ({"version": "2", "policy": {"max_errors": 1}}, 400, "unknown analysis setting"),
    ]
    for body, status, message in cases:
        response = client.post("/api/models/mlp/deploy", json=body, headers=operator)
        assert response.status_code == status and message in response.get_json()["error"]["message"], body
    first = deploy(client, operator, version="2", pause_s=3600)
    second = client.post("/api/models/mlp/deploy", json={"version": "2"}, headers=operator)
    assert second.status_code == 409 and "already has a rollout in progress" in second.get_json()["error"]["message"]
    assert client.post(f"/api/rollouts/{first['id']}/explode", headers=operator).status_code == 404
    assert client.post("/api/models/nope/rollback", headers=operator).status_code == 404


def test_rollback_with_nothing_to_return_to_is_a_clear_error(client, operator) -> None:
    response = client.post("/api/models/mlp/rollback", headers=operator)
    assert response.status_code == 409
    assert "no earlier stable version" in response.get_json()["error"]["message"]


def test_shadow_step_mirrors_traffic_compares_outputs_and_fails_on_disagreement(app, client, operator) -> None:
    policy = {"min_requests": 20}  # judged on agreement, not on noisy latency
    rollout = deploy(client, operator, version="2", steps=[100], pause_s=0, shadow=True, policy=policy)
    assert rollout["steps"] == [0, 100]
    settle(app)
    assert advance(app) == [f"{rollout['id']}: loaded -> progressing"]
    assert versions_served(client, 60) == {"1": 60}  # callers only ever get the live version's answers
    green = next(v for v in app.extensions["flightdeck"].engine.loaded("mlp") if v.slot == "green")
    assert green.batcher.wait_idle(10)  # the copies finish (and are compared) after their callers are answered
    assert green.shadow.compared == 60 and green.shadow.agreed == 0  # v2's weights differ: outputs disagree
    assert advance(app) == [f"{rollout['id']}: fail -> rolled_back"]
    detail = client.get(f"/api/rollouts/{rollout['id']}").get_json()
    assert "shadow outputs agree 0.00%" in detail["reason"]
    assert detail["measurements"][0]["figures"]["compared"] == 60


def test_dashboards_mark_rollout_starts_verdicts_and_endings(app, client, operator) -> None:
    rollout = deploy(client, operator, version="2", steps=[50, 100], pause_s=0, policy={"min_requests": 1000})
    settle(app)
    advance(app)
    versions_served(client, 10)
    advance(app)  # inconclusive: paused
    client.post(f"/api/rollouts/{rollout['id']}/abort", headers=operator)
    figures = client.get("/api/dashboards/figures?model=mlp&range=15m").get_json()["figures"]
    latency = next(f for f in figures if f["id"] == "latency")
    texts = " | ".join(a.get("text", "") for a in latency["layout"].get("annotations", []))
    assert "mlp 1 -&gt; 2 started (canary)" in texts or "mlp 1 -> 2 started (canary)" in texts, texts
    assert "step 1: inconclusive" in texts and "aborted" in texts


def test_refused_rollout_actions_leave_an_error_audit_event(app, client, operator) -> None:
    assert client.post("/api/models/mlp/rollback", headers=operator).status_code == 409
    assert client.post("/api/models/mlp/deploy", json={"version": "1"}, headers=operator).status_code == 409
    with app.extensions["flightdeck"].sessions() as session:
        events = [(e.action, e.outcome, e.actor) for e in session.scalars(select(AuditEvent).order_by(AuditEvent.id))]
    assert ("rollout.rollback", "error", "otto") in events
    assert ("rollout.start", "error", "otto") in events
