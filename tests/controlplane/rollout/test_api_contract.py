"""The rollout API's contract: typed bodies refused by name, and answers the document describes."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from controlplane.models import AuditEvent, Deployment, Rollout
from controlplane.rollout.enginewide import BATCHING_LIMITS
from controlplane.rollout.readmodel import ACTIONS
from controlplane.rollout.schemas import BatchingChange
from controlplane.rollout.states import DEPLOY_STRATEGIES


def refusal(response) -> str:
    assert response.status_code == 400, response.get_json()
    return response.get_json()["error"]["message"]


def rollouts(app) -> list[Rollout]:
    with app.extensions["flightdeck"].sessions() as session:
        return list(session.scalars(select(Rollout)))


def test_a_misspelt_strategy_is_refused_by_name_instead_of_running_a_canary(app, client, operator) -> None:
    response = client.post("/api/models/mlp/deploy", json={"version": "2", "strategey": "bluegreen"}, headers=operator)
    message = refusal(response)
    assert "unknown field(s) ['strategey']" in message and "'strategy'" in message
    assert rollouts(app) == []  # nothing started
    assert client.get("/api/models/mlp/deployment").get_json()["slots"]["green"] == {"version": None, "weight": 0}

    started = client.post("/api/models/mlp/deploy", json={"version": "2", "strategy": "bluegreen"}, headers=operator)
    assert started.status_code == 202, started.get_json()
    assert (started.get_json()["strategy"], started.get_json()["steps"]) == ("bluegreen", [100])


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"version": 2}, "'version' must be a non-empty string"),
        ({"version": ""}, "'version' must be a non-empty string"),
        ({"version": "2", "strategy": "rollback"}, "'strategy' must be one of 'canary' or 'bluegreen'"),
        ({"version": "2", "steps": [50, "100"]}, "'steps[1]' must be an integer"),
        ({"version": "2", "steps": [50, 150]}, "'steps' must rise to 100, each between 1 and 100"),
        ({"version": "2", "pause_s": -1}, "'pause_s' must be >= 0"),
        ({"version": "2", "shadow": "yes"}, "'shadow' must be true or false"),
        ({"version": "2", "policy": {"max_error_rate": 2}}, "'policy.max_error_rate' must be <= 1"),
        ({"version": "2", "policy": {"min_requests": "50"}}, "'policy.min_requests' must be an integer"),
        ({"version": "2", "policy": {"max_errors": 1}}, "'policy': unknown analysis setting(s) ['max_errors']"),
        ([{"version": "2"}], "the request body must be an object"),
    ],
)
def test_each_bad_deploy_body_is_refused_with_a_message_naming_the_field(app, client, operator, body, words) -> None:
    assert words in refusal(client.post("/api/models/mlp/deploy", json=body, headers=operator))
    assert rollouts(app) == []


def test_given_thresholds_are_stored_over_the_defaults(client, operator) -> None:
    body = {"version": "2", "steps": [50, 100], "pause_s": 30, "policy": {"min_requests": 7, "max_slowdown": 3}}
    rollout = client.post("/api/models/mlp/deploy", json=body, headers=operator).get_json()
    assert rollout["policy"]["min_requests"] == 7 and rollout["policy"]["max_slowdown"] == 3.0
    assert rollout["policy"]["max_error_rate"] == 0.01  # left out: the default
    assert (rollout["steps"], rollout["pause_s"], rollout["traffic_percent"]) == ([50, 100], 30.0, 0)


def test_a_retired_threshold_is_refused_with_what_replaced_it(app, client, operator) -> None:
    body = {"version": "2", "policy": {"max_p99_ratio": 1.5}}
    words = refusal(client.post("/api/models/mlp/deploy", json=body, headers=operator))
    assert "'max_p99_ratio' was retired" in words and "max_slowdown" in words
    assert rollouts(app) == []


def test_a_first_deploy_refuses_unknown_fields_too(app, client, operator) -> None:
    assert client.post("/api/models/textcls/undeploy", headers=operator).status_code == 200
    misspelt = client.post("/api/models/textcls/deploy", json={"version": "1", "verison": "2"}, headers=operator)
    assert "unknown field(s) ['verison']" in refusal(misspelt)
    with app.extensions["flightdeck"].sessions() as session:
        assert session.get(Deployment, "textcls") is None
    first = client.post("/api/models/textcls/deploy", json={"version": "1"}, headers=operator)
    assert first.status_code == 202
    assert first.get_json() == {
        "model": "textcls",
        "version": "1",
        "first_deploy": True,
        "generation": 1,
        "state": "loading",
    }


def test_a_refused_batching_body_names_the_field_and_leaves_an_error_event(app, client, operator) -> None:
    message = refusal(
        client.put("/api/engine/batching", json={"max_queue_size": 4, "max_bach_size": 2}, headers=operator)
    )
    assert message.startswith("unknown field(s) ['max_bach_size']")
    assert refusal(client.put("/api/engine/batching", json={}, headers=operator)) == (
        f"give at least one of {list(BATCHING_LIMITS)}"
    )
    with app.extensions["flightdeck"].sessions() as session:
        events = session.scalars(select(AuditEvent).where(AuditEvent.action == "engine.batching"))
        trail = [(e.outcome, e.detail["error"]) for e in events]
    assert [outcome for outcome, _ in trail] == ["error", "error"]
    assert "'max_bach_size'" in trail[0][1] and trail[1][1].startswith("give at least one of")
    changed = client.put(
        "/api/engine/batching", json={"max_queue_delay_ms": 5, "max_batch_size": None}, headers=operator
    )
    assert changed.status_code == 200
    assert changed.get_json()["batching"] == {"max_batch_size": 32, "max_queue_delay_ms": 5.0, "max_queue_size": 128}


def test_the_batching_body_names_exactly_the_engine_wide_limits() -> None:
    assert tuple(BatchingChange.model_fields) == BATCHING_LIMITS


def test_the_document_lists_what_the_rollout_api_accepts(client) -> None:
    document = client.get("/api/openapi.json").get_json()
    schemas = document["components"]["schemas"]
    strategy = schemas["DeployRequest"]["properties"]["strategy"]
    assert strategy["enum"] == [s.value for s in DEPLOY_STRATEGIES]
    assert schemas["DeployRequest"]["additionalProperties"] is False
    assert schemas["PolicyBody"]["properties"]["max_error_rate"]["maximum"] == 1
    act = document["paths"]["/api/rollouts/{rollout_id}/{action}"]["post"]
    action = next(p for p in act["parameters"] if p["name"] == "action")
    assert all(name in action["description"] for name in ACTIONS)
    deploy = document["paths"]["/api/models/{name}/deploy"]["post"]["responses"]["202"]
    refs = {entry["$ref"].rsplit("/", 1)[1] for entry in deploy["content"]["application/json"]["schema"]["anyOf"]}
    assert refs == {"RolloutView", "FirstDeployView"}
