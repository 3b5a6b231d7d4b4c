"""GPU telemetry degrades to nothing without a GPU, and the metrics page still renders."""

from __future__ import annotations

import re

import onnxruntime as ort
import pytest

from serving.telemetry import sample_gpus


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="GPU-absent path")
def test_no_gpu_means_no_samples_and_no_error(client) -> None:
    assert sample_gpus() == []
    page = client.get("/metrics")
    assert page.status_code == 200
    assert "flightdeck_gpu_utilization_ratio{" not in page.text
    assert re.search(r'^flightdeck_engine_ready\{node="[^"]+"\} 1\.0$', page.text, re.M)  # every series names its node
