"""The Grafana dashboard: committed file up to date, well formed, and only over metrics we export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from controlplane import metrics
from dashboards import grafana
from serving.batching import RequestOutcome

METRIC_NAME = re.compile(r"\bflightdeck_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(grafana.OUTPUT.read_text(encoding="utf-8"))


def exported_names() -> set[str]:
    """Every series name controlplane.metrics exposes, as prometheus_client writes them."""
    names = set()
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase):
            for family in collector.describe():
                names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def expressions(dashboard: dict) -> Iterator[str]:
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        yield variable["definition"]


def test_committed_file_is_what_the_generator_writes() -> None:
    assert grafana.OUTPUT.read_text(encoding="utf-8") == grafana.render(), "run: python -m dashboards.grafana"


def test_main_writes_the_file_and_check_notices_drift(tmp_path: Path) -> None:
    output = tmp_path / "grafana" / "flightdeck.json"

    assert grafana.main(["--check", "--output", str(output)]) == 1
    assert grafana.main(["--output", str(output)]) == 0
    assert output.read_text(encoding="utf-8") == grafana.render()
    assert grafana.main(["--check", "--output", str(output)]) == 0
    output.write_text(output.read_text(encoding="utf-8").replace("now-1h", "now-6h"), encoding="utf-8")
    assert grafana.main(["--check", "--output", str(output)]) == 1


def test_dashboard_is_importable_shape(committed: dict) -> None:
    assert committed["schemaVersion"] == 39
    assert committed["uid"] == "flightdeck"
    assert committed["id"] is None
    assert [i["name"] for i in committed["__inputs"]] == ["DS_PROMETHEUS"]
    assert committed["__inputs"][0]["pluginId"] == "prometheus"
    required_panels = {r["id"] for r in committed["__requires"] if r["type"] == "panel"}
    assert {p["type"] for p in committed["panels"]} <= required_panels


def test_model_variable_lists_models_from_model_info(committed: dict) -> None:
    variable, node = committed["templating"]["list"]
    assert node["name"] == "node" and node["definition"] == "label_values(flightdeck_engine_ready, node)"

    assert variable["name"] == "model"
    assert variable["definition"] == "label_values(flightdeck_model_info, model)"
    assert variable["query"]["query"] == variable["definition"]
    assert variable["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_panel_ids_unique_and_grid_positions_do_not_overlap(committed: dict) -> None:
    panels = committed["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))

    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("x", "y", "w", "h"))
        assert 0 <= pos["x"] and pos["w"] > 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine


def test_every_query_uses_the_dashboard_datasource(committed: dict) -> None:
    for panel in committed["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_panels_cover_the_issue(committed: dict) -> None:
    text = " ".join(expressions(committed))
    titles = {p["title"] for p in committed["panels"]}

    assert {"Throughput", "Queue depth", "Padding waste", "GPU utilisation", "GPU memory", "Traffic weights"} <= titles
    for q in ("0.5", "0.9", "0.99"):
        assert (
            f"histogram_quantile({q}, sum by (le, model, version) (rate(flightdeck_inference_request_seconds_bucket"
            in text
        )
    for outcome in ("error", "timeout", "rejected"):
        assert f'outcome="{outcome}"' in text
    assert "flightdeck_engine_ready" in text


def test_every_metric_in_a_query_is_exported(committed: dict) -> None:
    exported = exported_names()
    assert "flightdeck_inference_request_seconds_bucket" in exported  # the parse itself works
    assert "flightdeck_inference_requests_total" in exported

    used = {name for expr in expressions(committed) for name in METRIC_NAME.findall(expr)}

    assert used, "no metric names found"
    assert used <= exported, f"not exported by controlplane.metrics: {sorted(used - exported)}"


def test_label_values_in_queries_are_ones_we_emit(committed: dict) -> None:
    text = " ".join(expressions(committed))

    outcomes = set(re.findall(r'outcome="([^"]+)"', text))
    kinds = set(re.findall(r'kind="([^"]+)"', text))

    assert outcomes <= {o.value for o in RequestOutcome} | {"invalid"}
    assert kinds <= {"real", "padded"}


def test_expressions_are_balanced(committed: dict) -> None:
    for expr in expressions(committed):
        for opening, closing in ("()", "{}", "[]"):
            depth = 0
            for char in expr:
                depth += (char == opening) - (char == closing)
                assert depth >= 0, expr
            assert depth == 0, expr
