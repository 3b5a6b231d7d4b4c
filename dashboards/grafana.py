"""A Grafana dashboard over Flightdeck's Prometheus metrics, generated so it stays in step with them.

    python -m dashboards.grafana            # write dashboards/grafana/flightdeck.json
    python -m dashboards.grafana --check    # exit 1 when the committed file is out of date

Import the file in Grafana (Dashboards → New → Import) and pick the Prometheus data source that
scrapes Flightdeck's /metrics; the `model` variable lists models from `flightdeck_model_info`, the
`node` variable the nodes (every series carries `node`, FLIGHTDECK_NODE). The service panels sum
over the chosen nodes, so several nodes show as one service; the per-node panels group by `node`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dashboards.generated import generate

OUTPUT = Path(__file__).with_name("grafana") / "flightdeck.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
GRID_WIDTH = 24
WINDOW = "5m"
MODEL = 'model=~"$model", node=~"$node"'
NODE = 'node=~"$node"'
BY_SLOT = "model, version, slot"
SLOT_LEGEND = "{{model}} v{{version}} ({{slot}})"
REQUESTS = "flightdeck_inference_requests_total"


def target(expr: str, legend: str = "", **extra: object) -> dict:
    """One PromQL query of a panel (refIds are given when the panel is built)."""
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend or "__auto", "range": True, **extra}


def slot_rate(metric: str, selector: str = MODEL) -> str:
    """Per-second rate of a counter, summed over instances for each model/version/slot."""
    return f"sum by ({BY_SLOT}) (rate({metric}{{{selector}}}[{WINDOW}]))"


def quantile(q: float, histogram: str) -> str:
    """A latency quantile per model and version from merged histogram buckets (never averaged)."""
    return f"histogram_quantile({q}, sum by (le, model, version) (rate({histogram}_bucket{{{MODEL}}}[{WINDOW}])))"


def outcome_ratio(outcome: str) -> str:
    """The share of a slot's requests that ended with `outcome`."""
    part = slot_rate(REQUESTS, f'{MODEL}, outcome="{outcome}"')
    return f"{part} / {slot_rate(REQUESTS)}"


def timeseries(title: str, targets: Sequence[dict], unit: str, description: str = "", **defaults: object) -> dict:
    """A time-series panel (id and position are given by `arrange`)."""
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "spanNulls": False},
                **defaults,
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": _with_ref_ids(targets),
    }


def node_rate(metric: str, selector: str) -> str:
    """Per-second rate of a counter for each node, summed over its models and processes."""
    return f"sum by (node) (rate({metric}{{{selector}}}[{WINDOW}]))"


def readiness_panel() -> dict:
    """A stat per node: ready (1) or not (0)."""
    return {
        "type": "stat",
        "title": "Engine readiness",
        "description": "1 when every serving process of the node is ready.",
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {
                "mappings": [
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "not ready", "color": "red", "index": 0},
                            "1": {"text": "ready", "color": "green", "index": 1},
                        },
                    }
                ],
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
                },
            },
            "overrides": [],
        },
        "options": {
            "colorMode": "background",
            "graphMode": "none",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "value_and_name",
        },
        "targets": _with_ref_ids([target(f"min by (node) (flightdeck_engine_ready{{{NODE}}})", "{{node}}")]),
    }


def batch_heatmap() -> dict:
    """Batches per batch-size bucket over time."""
    expr = f"sum by (le) (increase(flightdeck_inference_batch_size_bucket{{{MODEL}}}[$__rate_interval]))"
    return {
        "type": "heatmap",
        "title": "Batch size distribution",
        "description": "Executed batches per batch-size bucket.",
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "yAxis": {"axisLabel": "batch size"},
            "tooltip": {"mode": "single", "yHistogram": False},
            "legend": {"show": True},
        },
        "targets": _with_ref_ids([target(expr, "{{le}}", format="heatmap")]),
    }


def loaded_versions_table() -> dict:
    """Which versions each node has loaded, on which provider."""
    expr = f"max by (node, model, version, slot, provider) (flightdeck_model_info{{{MODEL}}})"
    return {
        "type": "table",
        "title": "Loaded versions",
        "gridPos": {"w": GRID_WIDTH},
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
        "transformations": [{"id": "labelsToFields", "options": {}}],
        "targets": _with_ref_ids([target(expr, "", format="table", instant=True, range=False)]),
    }


def panels() -> list[dict]:
    """Every panel, in reading order, with its width."""
    success = f'{MODEL}, outcome="success"'
    failed = f'{MODEL}, outcome=~"error|timeout|rejected"'
    real = slot_rate("flightdeck_sequence_tokens_total", f'{MODEL}, kind="real"')
    padded = slot_rate("flightdeck_sequence_tokens_total", f'{MODEL}, kind="padded"')
    latency = [
        target(quantile(q, "flightdeck_inference_request_seconds"), f"{{{{model}}}} v{{{{version}}}} p{p}")
        for q, p in ((0.5, 50), (0.9, 90), (0.99, 99))
    ]
    stages = [
        target(quantile(0.99, f"flightdeck_inference_{stage}_seconds"), f"{{{{model}}}} v{{{{version}}}} {stage} p99")
        for stage in ("queue", "compute")
    ]
    mean_batch = (
        f"{slot_rate('flightdeck_inference_batch_size_sum')} / {slot_rate('flightdeck_inference_batch_size_count')}"
    )
    return [
        timeseries(
            "Throughput",
            [target(slot_rate(REQUESTS, success), SLOT_LEGEND)],
            "reqps",
            "Successful requests per second.",
        ),
        timeseries("Latency p50 / p90 / p99", latency, "s", "Engine time per request, queue plus compute."),
        timeseries(
            "Error, timeout and rejection rates",
            [target(outcome_ratio(o), f"{SLOT_LEGEND} {o}") for o in ("error", "client_error", "timeout", "rejected")],
            "percentunit",
            "Share of each slot's requests by outcome: error is the model's or engine's fault, client_error a 400 "
            "for the request's own input.",
        ),
        timeseries(
            "Queue depth",
            [target(f"sum by ({BY_SLOT}) (flightdeck_queue_depth{{{MODEL}}})", SLOT_LEGEND)],
            "short",
            "Samples waiting.",
        ),
        timeseries(
            "Throughput by node",
            [target(node_rate(REQUESTS, success), "{{node}}")],
            "reqps",
            "Successful requests per second each node answered: the load balancer's spread.",
        ),
        timeseries(
            "Errors by node",
            [target(node_rate(REQUESTS, failed), "{{node}}")],
            "reqps",
            "Failed, timed-out and rejected requests per second on each node: one sick node stands out here.",
        ),
        timeseries(
            "Queue depth by node",
            [target(f"sum by (node) (flightdeck_queue_depth{{{MODEL}}})", "{{node}}")],
            "short",
            "Samples waiting on each node.",
        ),
        timeseries("Queue wait and compute p99", stages, "s"),
        timeseries("Mean batch size", [target(mean_batch, SLOT_LEGEND)], "short", "Samples per executed batch."),
        batch_heatmap(),
        timeseries(
            "Padding waste",
            [target(f"1 - ({real} / {padded})", SLOT_LEGEND)],
            "percentunit",
            "Share of sequence positions that were padding.",
            min=0,
            max=1,
        ),
        timeseries(
            "GPU utilisation",
            [target(f"flightdeck_gpu_utilization_ratio{{{NODE}}}", "{{node}} gpu{{gpu}}")],
            "percentunit",
            min=0,
            max=1,
        ),
        timeseries(
            "GPU memory",
            [
                target(f"flightdeck_gpu_memory_used_bytes{{{NODE}}}", "{{node}} gpu{{gpu}} used"),
                target(f"flightdeck_gpu_memory_total_bytes{{{NODE}}}", "{{node}} gpu{{gpu}} total"),
            ],
            "bytes",
            min=0,
        ),
        timeseries(
            "Drift against each version's reference",
            [
                target(
                    f"max by (model, version, kind, name) (flightdeck_drift_score{{{MODEL}}})",
                    "{{model}} v{{version}} {{kind}}:{{name}}",
                )
            ],
            "short",
            "Jensen-Shannon divergence in bits (0: the same distribution, 1: no overlap) of each version's predicted "
            "labels and sampled input features over the last FLIGHTDECK_DRIFT_WINDOW_S, against its reference window.",
            min=0,
            max=1,
        ),
        readiness_panel(),
        timeseries(
            "Traffic weights",
            [target(f"max by (model, slot) (flightdeck_traffic_weight{{{MODEL}}})", "{{model}} {{slot}}")],
            "percent",
            "Share of a model's traffic each slot receives.",
            min=0,
            max=100,
        ),
        loaded_versions_table(),
    ]


def arrange(items: Sequence[dict], width: int = 12, height: int = 8) -> list[dict]:
    """Give panels ids and grid positions, left to right, wrapping at the grid's width."""
    placed, x, y = [], 0, 0
    for panel_id, panel in enumerate(items, start=1):
        w = panel.get("gridPos", {}).get("w", width)
        if x + w > GRID_WIDTH:
            x, y = 0, y + height
        placed.append({**panel, "id": panel_id, "gridPos": {"h": height, "w": w, "x": x, "y": y}})
        x += w
    return placed


def model_variable() -> dict:
    """The `model` template variable: every model Prometheus has seen loaded."""
    return _variable("model", "Model", "label_values(flightdeck_model_info, model)")


def node_variable() -> dict:
    """The `node` template variable: every node reporting readiness."""
    return _variable("node", "Node", "label_values(flightdeck_engine_ready, node)")


def _variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
        "skipUrlSync": False,
    }


def dashboard() -> dict:
    """The whole dashboard, ready for Grafana's import."""
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "The Prometheus that scrapes Flightdeck's /metrics.",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "heatmap", "name": "Heatmap", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
            {"type": "panel", "id": "table", "name": "Table", "version": ""},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": "Flightdeck model serving: traffic, latency, errors, batching and GPUs.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": arrange(panels()),
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["flightdeck", "onnx", "serving"],
        "templating": {"list": [model_variable(), node_variable()]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "utc",
        "title": "Flightdeck",
        "uid": "flightdeck",
        "version": 1,
        "weekStart": "",
    }


def render() -> str:
    """The dashboard as the committed file holds it."""
    return json.dumps(dashboard(), indent=2) + "\n"


def _with_ref_ids(targets: Sequence[dict]) -> list[dict]:
    return [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)]


def main(argv: Sequence[str] | None = None) -> int:
    """Write the dashboard file, or with --check report whether it is up to date."""
    description = __doc__.splitlines()[0]
    return generate(
        argv, module="dashboards.grafana", description=description, output=OUTPUT, render=lambda _: render()
    )


if __name__ == "__main__":
    sys.exit(main())
