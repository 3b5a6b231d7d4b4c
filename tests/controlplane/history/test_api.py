"""The history API over real sampled rows; every bad parameter is a 400 that names it."""

from __future__ import annotations

import pytest

BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def test_series_and_summary_reflect_served_requests(app, client) -> None:
    for _ in range(5):
        assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
    app.extensions["flightdeck"].sampler.sample()
    response = client.get("/api/history?metric=p99&start=-10m&step=60&model=mlp")
    assert response.status_code == 200
    data = response.get_json()
    assert data["unit"] == "ms" and data["step"] == 60
    (blue,) = data["series"]
    assert blue["labels"] == {"model": "mlp", "version": "1", "slot": "blue"}
    values = [v for _, v in blue["points"] if v is not None]
    assert len(values) == 1 and values[0] > 0
    rows = client.get("/api/history/summary?start=-10m").get_json()["rows"]
    assert {(r["model"], r["requests"]) for r in rows} >= {("mlp", 5), ("textcls", 0)}
    gpu = client.get("/api/history?metric=gpu_utilization&start=-10m").get_json()
    assert gpu["series"] == []  # no GPU here: no series, and no error
    frag = client.get("/api/history?metric=fragmentation&start=-10m").get_json()
    assert frag["series"][0]["labels"] == {"device": "cpu"}


def test_the_catalog_lists_every_metric_with_its_unit(client) -> None:
    names = {m["name"]: m["unit"] for m in client.get("/api/history/metrics").get_json()["metrics"]}
    assert names["p99"] == "ms" and names["error_rate"] == "ratio" and "fragmentation" in names


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("metric=p42", "'metric' must be one of"),
        ("", "'metric' must be one of"),
        ("metric=p99&start=yesterday", "'start' must be 'now', a relative time"),
        ("metric=p99&end=2026-13-45", "'end' must be"),
        ("metric=p99&start=-1h&end=-2h", "must be before 'end'"),
        ("metric=p99&step=0", "'step' must be a whole number"),
        ("metric=p99&step=abc", "'step' must be a whole number"),
        ("metric=p99&start=-7d&step=1", "more than 5000 points"),
    ],
)
def test_bad_parameters_are_400_with_the_envelope(client, query: str, message: str) -> None:
    response = client.get(f"/api/history?{query}", headers={"X-Request-ID": "hist-1"})
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert message in error["message"] and error["code"] == "bad_request" and error["request_id"] == "hist-1"


def test_cli_prints_the_summary(app, client, home, monkeypatch) -> None:
    from click.testing import CliRunner

    from controlplane.cli import cli

    for _ in range(4):
        client.post("/v2/models/mlp/infer", json=BODY)
    app.extensions["flightdeck"].sampler.sample()
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    result = CliRunner().invoke(cli, ["history", "--since", "-5m", "--model", "mlp"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("mlp"))
    assert line.split()[:4] == ["mlp", "1", "blue", "4"]
    bad = CliRunner().invoke(cli, ["history", "--since", "soon"])
    assert bad.exit_code != 0 and "'since' must be" in bad.output


def test_dashboard_figures_are_drawn_from_recorded_rows(app, client) -> None:
    for _ in range(6):
        client.post("/v2/models/mlp/infer", json=BODY)
    app.extensions["flightdeck"].sampler.sample()
    response = client.get("/api/dashboards/figures?model=mlp&range=15m")
    assert response.status_code == 200
    figures = {f["id"]: f for f in response.get_json()["figures"]}
    latency_traces = figures["latency"]["data"]
    assert latency_traces and all("mlp v1 (blue)" in t["name"] for t in latency_traces)
    assert any(y is not None for t in latency_traces for y in t["y"])
    assert sum(b for t in figures["batch"]["data"] for b in t["y"]) == 6  # six batches of one


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("metric=p99&slot=purple", "'slot' must be one of"),
        ("metric=p99&start=now&end=now", "must be before 'end'"),  # both ends read against one 'now'
    ],
)
def test_slots_are_the_two_slots_and_a_range_is_never_empty(client, query: str, message: str) -> None:
    response = client.get(f"/api/history?{query}")
    assert response.status_code == 400 and message in response.get_json()["error"]["message"]


def test_series_filter_by_slot(app, client) -> None:
    for _ in range(3):
        assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
    app.extensions["flightdeck"].sampler.sample()
    blue = client.get("/api/history?metric=requests&start=-10m&model=mlp&slot=blue").get_json()["series"]
    green = client.get("/api/history?metric=requests&start=-10m&model=mlp&slot=green").get_json()["series"]
    assert [s["labels"]["slot"] for s in blue] == ["blue"] and green == []
    assert client.get("/api/history/summary?start=-10m&end=-20m").status_code == 400
