"""The generated Prometheus rules over several nodes: every series carries `node` (controlplane.metrics.render).

Request rates and latencies add up across nodes; a device is one node's own, so gpu="0" on two
nodes is two GPUs; traffic weights every node reports alike are one model's, not a split.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import prometheus

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not on PATH (apt-get install prometheus)")


def _series(name: str, labels: dict[str, str], values: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _rule(name: str) -> dict:
    document = yaml.safe_load(prometheus.OUTPUT.read_text(encoding="utf-8"))
    return next(r for g in document["groups"] for r in g["rules"] if r["alert"] == name)


def test_rules_aggregate_requests_across_nodes_and_keep_devices_apart(tmp_path: Path) -> None:
    blue = {"model": "mlp", "version": "1", "slot": "blue"}
    series = []
    # Node a fails 10% of its 100 requests a minute, node b none of its 900: 1% overall, under the 5% rule.
    for node, ok, errors in (("a", 90, 10), ("b", 900, 0)):
        series += [
            _series("flightdeck_inference_requests_total", {**blue, "node": node, "outcome": "success"}, f"0+{ok}x30"),
            _series("flightdeck_inference_requests_total", {**blue, "node": node, "outcome": "error"}, f"0+{errors}x30"),
            _series("flightdeck_traffic_weight", {"model": "mlp", "slot": "blue", "node": node}, "100x30"),
            _series("flightdeck_traffic_weight", {"model": "mlp", "slot": "green", "node": node}, "0x30"),
            _series("flightdeck_engine_ready", {"node": node}, "1x30"),
            _series("flightdeck_gpu_memory_total_bytes", {"node": node, "gpu": "0"}, "100x30"),
        ]  # fmt: skip
    series += [
        _series("flightdeck_gpu_memory_used_bytes", {"node": "a", "gpu": "0"}, "95x30"),
        _series("flightdeck_gpu_memory_used_bytes", {"node": "b", "gpu": "0"}, "10x30"),
    ]
    rule = _rule("gpu_memory_high")
    gpu_alert = {
        "exp_labels": {"node": "a", "gpu": "0", "severity": rule["labels"]["severity"]},
        "exp_annotations": {**rule["annotations"], "summary": "gpu0: memory 95% used"},
    }
    checks = [
        {"eval_time": "20m", "alertname": "high_error_rate", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "split_traffic_outside_rollout", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "engine_not_ready", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "gpu_memory_high", "exp_alerts": [gpu_alert]},
    ]
    shutil.copy(prometheus.OUTPUT, tmp_path / "rules.yml")
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")

    result = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False, timeout=60
    )

    assert result.returncode == 0, result.stdout + result.stderr
