"""The dashboards page, its figures API and the locally served plotly.js.

These tests attach a small fake history with fixed data (the real history queries are tested with
the history package).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest

from controlplane import dashboards_view
from controlplane.auth import Role
from dashboards.figures import FIGURES
from tests.controlplane.conftest import log_in

HOSTILE = "<script>alert(1)</script>"


class FakeHistory:
    """Fixed series for model mlp, and a record of what the view asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def series(self, metric: str, start: datetime, end: datetime, step_s: int, model: str | None) -> list[dict]:
        self.calls.append(("series", metric, start, end, step_s, model))
        if metric.startswith("gpu_") or metric == "fragmentation":
            return [{"labels": {"device": "cpu"}, "points": [[start.isoformat(), 0.25]]}]
        labels = {"model": "mlp", "version": "1", "slot": "blue"}
        return [{"labels": labels, "points": [[start.isoformat(), 1.0], [end.isoformat(), None]]}]

    def batch_distribution(self, start: datetime, end: datetime, model: str | None) -> list[dict]:
        self.calls.append(("batch_distribution", start, end, model))
        return [{"labels": {"model": "mlp", "version": "1", "slot": "blue"}, "counts": {"1": 3, "4": 1}}]

    def drift_series(self, start: datetime, end: datetime, step_s: int, model: str | None) -> list[dict]:
        self.calls.append(("drift_series", start, end, step_s, model))
        labels = {"model": "mlp", "version": "1", "kind": "input", "name": "input"}
        return [{"labels": labels, "points": [[start.isoformat(), 0.02], [end.isoformat(), 0.4]]}]

    def markers(self, start: datetime, end: datetime, model: str | None) -> list[dict]:
        self.calls.append(("markers", start, end, model))
        return [{"time": (start + timedelta(seconds=1)).isoformat(), "kind": "alert", "text": HOSTILE}]


@pytest.fixture(autouse=True)
def quick_app(app_config: dict) -> None:
    """One small model, warmed at the shortest bucket: the page lists it, start-up stays quick."""
    app_config["load_models"] = "mlp"
    app_config["warmup_max_sequence"] = 16


@pytest.fixture
def history(app, client) -> FakeHistory:
    """Log the client in (the page is the console's) and attach the fake history."""
    log_in(client, app, "vic", Role.VIEWER)
    fake = FakeHistory()
    app.extensions["flightdeck"].history = fake
    return fake


def local_references(html: str) -> list[str]:
    return re.findall(r'(?:src|href|action|data-api)="([^"]*)"', html)


def test_page_renders_controls_and_a_div_per_figure(client, history) -> None:
    response = client.get("/dashboards")

    assert response.status_code == 200
    assert response.mimetype == "text/html"
    html = response.get_data(as_text=True)
    for figure_id, _ in FIGURES:
        assert f'id="fig-{figure_id}"' in html
    assert '<option value="mlp">mlp</option>' in html
    for choice in ("15m", "1h", "6h", "24h", "7d"):
        assert f'<option value="{choice}"' in html
    assert '<option value="1h" selected>' in html
    assert 'name="refresh"' in html and 'name="every"' in html


def test_page_loads_only_local_scripts(client, history) -> None:
    response = client.get("/dashboards")
    html = response.get_data(as_text=True)

    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    scripts = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
    assert any(s.startswith("/assets/plotly.min.js") for s in scripts)
    assert "/static/dashboards.js" in scripts
    assert all(ref.startswith("/") and not ref.startswith("//") for ref in local_references(html))
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "no inline scripts"
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    for src in scripts:
        with client.get(src) as script:  # a file response: closed here, as a WSGI server would
            assert script.status_code == 200


def test_page_keeps_the_chosen_model_range_and_refresh(client, history) -> None:
    html = client.get("/dashboards?model=retired&range=6h&refresh=on&every=60").get_data(as_text=True)

    assert '<option value="retired" selected>retired</option>' in html  # history may outlive the model
    assert '<option value="6h" selected>' in html
    assert 'name="refresh" value="on" checked' in html
    assert '<option value="60" selected>' in html


@pytest.mark.parametrize(
    "query",
    [f"model={HOSTILE}", f"range={HOSTILE}", f"every={HOSTILE}&refresh={HOSTILE}", f"model=mlp&{HOSTILE}=1"],
)
def test_nothing_a_user_passes_reaches_the_page_unescaped(client, history, query: str) -> None:
    response = client.get("/dashboards", query_string=query)

    html = response.get_data(as_text=True)
    assert HOSTILE not in html
    assert "<script>alert" not in html
    assert response.status_code in (200, 400)


def test_page_with_a_bad_parameter_says_so(client, history) -> None:
    response = client.get("/dashboards", query_string={"range": "2y"})

    assert response.status_code == 400
    assert "range must be one of" in response.get_data(as_text=True)


def test_plotly_js_is_served_from_the_installed_package(client, history) -> None:
    with client.get("/assets/plotly.min.js") as response:
        body = response.get_data()

    assert response.status_code == 200
    assert response.mimetype in ("text/javascript", "application/javascript")
    assert len(body) > 1_000_000
    assert b"plotly" in body[:500].lower()
    assert response.headers["Content-Length"] == str(len(body))
    assert "max-age=31536000" in response.headers["Cache-Control"]
    assert dashboards_view.plotly_js_path().read_bytes() == body


def test_figures_api_builds_every_figure_from_the_history(client, history) -> None:
    response = client.get("/api/dashboards/figures?model=mlp&range=15m")

    assert response.status_code == 200
    body = response.get_json()
    assert (body["model"], body["range"]) == ("mlp", "15m")
    figures = {f["id"]: f for f in body["figures"]}
    assert list(figures) == [f for f, _ in FIGURES]
    assert [t["name"] for t in figures["throughput"]["data"]] == ["mlp v1 (blue)"]
    assert figures["batch"]["data"][0]["x"] == ["1", "4"]
    assert len(figures["latency"]["layout"]["shapes"]) == 1  # the alert marker
    assert "<script>" not in response.get_data(as_text=True)  # marker text is escaped for Plotly

    series_calls = [c for c in history.calls if c[0] == "series"]
    assert {c[1] for c in series_calls} >= {"throughput", "p50", "p90", "p99", "error_rate", "gpu_utilization"}
    for _, _, start, end, step_s, model in series_calls:
        assert (end - start, step_s, model) == (timedelta(minutes=15), 10, "mlp")
    assert ("batch_distribution", start, end, "mlp") in history.calls


@pytest.mark.parametrize(
    ("range_name", "span", "step_s"),
    [
        ("15m", timedelta(minutes=15), 10),
        ("1h", timedelta(hours=1), 30),
        ("6h", timedelta(hours=6), 120),
        ("24h", timedelta(days=1), 600),
        ("7d", timedelta(days=7), 3600),
    ],
)
def test_step_follows_the_range(client, history, range_name: str, span: timedelta, step_s: int) -> None:
    assert client.get(f"/api/dashboards/figures?range={range_name}").status_code == 200

    _, _, start, end, step, model = history.calls[0]
    assert (end - start, step, model) == (span, step_s, None)


def test_figures_api_defaults_to_every_model_over_an_hour(client, history) -> None:
    body = client.get("/api/dashboards/figures").get_json()

    assert (body["model"], body["range"]) == (None, "1h")


@pytest.mark.parametrize(
    ("query", "parameter"),
    [("range=2y", "range"), ("range=1h;drop", "range"), (f"model={HOSTILE}", "model"), ("model=" + "m" * 200, "model")],
)
def test_bad_parameters_get_the_error_envelope(client, history, query: str, parameter: str) -> None:
    response = client.get(f"/api/dashboards/figures?{query}", headers={"X-Request-ID": "req-42"})

    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "bad_request"
    assert error["message"].startswith(parameter)
    assert error["request_id"] == response.headers["X-Request-ID"]
    assert HOSTILE not in response.get_data(as_text=True)
    assert history.calls == []


def test_figures_api_without_a_history_service_is_unavailable(app, client, history) -> None:
    app.extensions["flightdeck"].history = None

    response = client.get("/api/dashboards/figures")

    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"
