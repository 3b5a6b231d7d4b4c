"""The OpenAPI document stays true to the management routes."""

from __future__ import annotations

import re


def api_routes(app) -> set[tuple[str, str]]:
    routes = set()
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/"):
            continue
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            routes.add((path, method.lower()))
    return routes


def test_every_api_route_is_documented_and_every_documented_path_exists(app, client) -> None:
    document = client.get("/api/openapi.json").get_json()
    assert document["openapi"].startswith("3.")
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == api_routes(app)


def test_documented_enums_match_what_the_api_accepts(client) -> None:
    document = client.get("/api/openapi.json").get_json()
    metric = next(p for p in document["paths"]["/api/history"]["get"]["parameters"] if p["name"] == "metric")
    catalog = {m["name"] for m in client.get("/api/history/metrics").get_json()["metrics"]}
    assert set(metric["schema"]["enum"]) == catalog
    for name in sorted(catalog)[:3]:
        assert client.get(f"/api/history?metric={name}&start=-5m").status_code == 200
