"""The OpenAPI document is generated from the routes: it covers all of them and is a valid OpenAPI 3.1 document."""

from __future__ import annotations

import re

from openapi_spec_validator import validate

from controlplane.contract import CONTRACT
from controlplane.openapi import DOCUMENTED


def documented_routes(app) -> set[tuple[str, str]]:
    routes = set()
    for rule in app.url_map.iter_rules():
        if not DOCUMENTED.match(rule.rule):
            continue
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            routes.add((path, method.lower()))
    return routes


def test_every_route_is_documented_and_every_documented_path_exists(app, client) -> None:
    document = client.get("/api/openapi.json").get_json()
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == documented_routes(app)
    assert {"/api/models/{name}/deploy", "/v2/models/{name}/infer", "/metrics"} <= set(document["paths"])


def test_the_document_is_valid_openapi_3_1(client) -> None:
    document = client.get("/api/openapi.json").get_json()
    assert document["openapi"] == "3.1.0"
    validate(document)


def test_every_route_declares_its_contract(app) -> None:
    missing = sorted(
        rule.rule
        for rule in app.url_map.iter_rules()
        if DOCUMENTED.match(rule.rule) and getattr(app.view_functions[rule.endpoint], CONTRACT, None) is None
    )
    assert missing == []


def test_documented_enums_match_what_the_api_accepts(client) -> None:
    document = client.get("/api/openapi.json").get_json()
    metric = next(p for p in document["paths"]["/api/history"]["get"]["parameters"] if p["name"] == "metric")
    catalog = {m["name"] for m in client.get("/api/history/metrics").get_json()["metrics"]}
    assert set(metric["schema"]["enum"]) == catalog
    for name in sorted(catalog)[:3]:
        assert client.get(f"/api/history?metric={name}&start=-5m").status_code == 200


def test_security_follows_each_routes_guard(client) -> None:
    paths = client.get("/api/openapi.json").get_json()["paths"]
    assert paths["/api/session"]["post"]["security"] == []
    assert paths["/api/models/{name}/deploy"]["post"]["x-required-role"] == "operator"
    assert paths["/api/users"]["post"]["x-required-role"] == "admin"
    assert paths["/api/models"]["get"]["x-required-role"] == "viewer"
    assert paths["/v2/health/ready"]["get"]["security"] == [{}, {"bearer": []}]


def test_the_api_page_is_served_offline(client) -> None:
    page = client.get("/api/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.get_data(as_text=True))
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        assert asset.startswith("/api/docs/assets/")
        with client.get(asset) as response:
            assert response.status_code == 200 and len(response.data) > 100
