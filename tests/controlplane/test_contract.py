"""The contract layer: typed bodies refused with messages that name the field, answers serialised from their model."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from flask import Flask
from pydantic import Field, model_validator

from controlplane import errorhandlers
from controlplane.contract import QueryArgs, Reply, RequestBody, operation


class Policy(RequestBody):
    max_error_rate: float = Field(ge=0, le=1)


class Start(RequestBody):
    version: str = Field(min_length=1)
    strategy: Literal["canary", "bluegreen"] = "canary"
    steps: list[int] | None = None
    policy: Policy | None = None


class Window(RequestBody):
    start: int
    end: int

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end <= self.start:
            raise ValueError("'end' must be after 'start'")
        return self


class Page(QueryArgs):
    limit: int = Field(100, ge=1, le=1000)


class Started(Reply):
    version: str
    strategy: str


@pytest.fixture
def client():
    app = Flask(__name__)
    errorhandlers.register_handlers(app)

    @app.post("/start")
    @operation(body=Start, response=Started, status=202)
    def start(body: Start) -> dict[str, Any]:
        return {"version": body.version, "strategy": body.strategy}

    @app.post("/leaky")
    @operation(body=Start, response=Started, body_required=False)
    def leaky(body: Start) -> dict[str, Any]:
        return {"version": "1", "strategy": "canary", "secret": "never sent"}

    @app.post("/window")
    @operation(body=Window, response=dict[str, int])
    def window(body: Window) -> dict[str, int]:
        return {"span": body.end - body.start}

    @app.get("/page")
    @operation(query=Page, response=dict[str, int])
    def page(query: Page) -> dict[str, int]:
        return {"limit": query.limit}

    return app.test_client()


def refusal(response) -> str:
    assert response.status_code == 400, response.get_data(as_text=True)
    return response.get_json()["error"]["message"]


def test_a_valid_body_reaches_the_view_typed_and_the_answer_has_the_declared_status(client) -> None:
    response = client.post("/start", json={"version": "2", "strategy": "bluegreen"})
    assert response.status_code == 202
    assert response.get_json() == {"version": "2", "strategy": "bluegreen"}


def test_a_misspelt_field_is_refused_by_name_instead_of_silently_using_the_default(client) -> None:
    message = refusal(client.post("/start", json={"version": "2", "strategey": "bluegreen"}))
    assert "unknown field(s) ['strategey']" in message and "strategy" in message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({}, "'version' is required"),
        ({"version": 2}, "'version' must be a string"),
        ({"version": ""}, "'version' must not be empty"),
        ({"version": "2", "strategy": "yolo"}, "'strategy' must be one of 'canary' or 'bluegreen'"),
        ({"version": "2", "steps": [10, "50"]}, "'steps[1]' must be an integer"),
        ({"version": "2", "policy": {"max_error_rate": 2}}, "'policy.max_error_rate' must be <= 1"),
        ({"version": "2", "policy": {"max_eror_rate": 0.1}}, "unknown field(s) ['policy.max_eror_rate']"),
        ([1, 2], "the request body must be an object"),
    ],
)
def test_each_kind_of_bad_body_gets_a_message_naming_the_field(client, body, words) -> None:
    assert words in refusal(client.post("/start", json=body))


def test_malformed_and_deeply_nested_json_are_400s_not_500s(client) -> None:
    assert "not valid JSON" in refusal(client.post("/start", data="{nope", content_type="application/json"))
    nested = "[" * 100_000 + "]" * 100_000
    assert "not valid JSON" in refusal(client.post("/start", data=nested, content_type="application/json"))
    assert "must be a JSON object" in refusal(client.post("/start"))


def test_an_optional_body_may_be_left_out_but_not_misspelt(client) -> None:
    assert "unknown field(s) ['x']" in refusal(client.post("/leaky", json={"x": 1}))


def test_a_field_the_answer_does_not_declare_is_never_sent(client) -> None:
    response = client.post("/leaky", json={"version": "1"})
    assert response.status_code == 500
    assert "never sent" not in response.get_data(as_text=True)


def test_query_values_are_parsed_and_checked(client) -> None:
    assert client.get("/page?limit=5").get_json() == {"limit": 5}
    assert client.get("/page").get_json() == {"limit": 100}
    assert "'limit' must be an integer" in refusal(client.get("/page?limit=five"))
    assert "'limit' must be <= 1000" in refusal(client.get("/page?limit=5000"))


def test_a_rule_over_several_fields_is_reported_in_its_own_words(client) -> None:
    assert refusal(client.post("/window", json={"start": 5, "end": 1})) == "'end' must be after 'start'"
    assert client.post("/window", json={"start": 1, "end": 5}).get_json() == {"span": 4}
