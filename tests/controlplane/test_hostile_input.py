"""Hostile input gets a 4xx, never a 500, and is not read into memory past the limits (issue 12, items 3 and 9)."""

from __future__ import annotations

import json

from controlplane.app import MAX_API_BODY_BYTES


def test_a_huge_anonymous_management_body_is_refused_before_it_is_read(client) -> None:
    big = b"x" * (MAX_API_BODY_BYTES + 1)
    response = client.post("/api/session", data=big, content_type="application/json")
    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "request_entity_too_large"
    form = client.post("/login", data={"name": "x" * (MAX_API_BODY_BYTES + 1), "password": "p"})
    assert form.status_code == 413


def test_inference_bodies_keep_their_own_larger_limit(client) -> None:
    rows = 6000  # about 2 MiB of JSON: over the management limit, under FLIGHTDECK_MAX_REQUEST_BYTES
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [rows, 64], "datatype": "FP32", "data": [0.5] * (rows * 64)}]}
    )
    assert len(body) > MAX_API_BODY_BYTES
    response = client.post("/v2/models/mlp/infer", data=body, content_type="application/json")
    assert response.status_code != 413, response.get_data(as_text=True)[:200]


def test_deeply_nested_json_is_a_400_everywhere(client, operator) -> None:
    nested = "[" * 50_000 + "]" * 50_000
    for path in ("/api/session", "/v2/models/mlp/infer", "/api/models/mlp/deploy"):
        response = client.post(path, data=nested, content_type="application/json", headers=operator)
        assert response.status_code == 400, (path, response.status_code)


def test_a_shape_whose_element_count_overflows_is_a_400(client) -> None:
    for shape in ([2**40, 2**40], [2**63 - 1, 2], [-2, 64]):
        body = {"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
        response = client.post("/v2/models/mlp/infer", json=body)
        assert response.status_code == 400, (shape, response.status_code, response.get_data(as_text=True)[:200])


def test_a_next_parameter_with_a_line_break_cannot_split_the_redirect(client) -> None:
    response = client.get("/login?next=/alerts%0d%0aSet-Cookie:%20evil=1")
    assert response.status_code == 200  # anonymous: the login form, its hidden next field safe
    assert "evil" not in response.headers.get("Location", "")
    assert "evil" not in response.headers.get("Set-Cookie", "")
    assert "evil" not in response.get_data(as_text=True)  # the form's next field fell back to the overview
