"""The /v2 answers the server really sends fit the models the OpenAPI document describes them with."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from controlplane.inference_schemas import (
    InferenceRequest,
    InferenceResponse,
    Live,
    ModelConfig,
    ModelMetadata,
    ModelReady,
    ModelStatistics,
    OipError,
    Ready,
    ServerMetadata,
)


def fits(model: type[BaseModel] | object, payload: object) -> None:
    TypeAdapter(model).validate_python(payload, strict=False)


def test_every_v2_answer_fits_its_documented_model(client) -> None:
    batch = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    request = {
        "id": "r1",
        "inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32", "data": batch.ravel().tolist()}],
    }
    fits(InferenceRequest, request)
    answer = client.post("/v2/models/mlp/infer", json=request)
    assert answer.status_code == 200
    fits(InferenceResponse, answer.get_json())
    fits(ServerMetadata, client.get("/v2").get_json())
    fits(Live, client.get("/v2/health/live").get_json())
    fits(Ready, client.get("/v2/health/ready").get_json())
    fits(ModelMetadata, client.get("/v2/models/mlp").get_json())
    fits(ModelConfig, client.get("/v2/models/mlp/config").get_json())
    fits(ModelReady, client.get("/v2/models/mlp/ready").get_json())
    stats = client.get("/v2/models/stats").get_json()
    fits(ModelStatistics, stats)
    assert stats["model_stats"][0]["inference_stats"]["compute_input"]["count"] >= 0
    fits(OipError, client.get("/v2/models/nope").get_json())


def test_the_response_models_refuse_what_the_server_must_not_send() -> None:
    with pytest.raises(ValidationError):  # the models are strict enough to catch a drifted answer
        fits(InferenceResponse, {"model_name": "mlp", "outputs": [{"name": "y", "shape": [1], "datatype": "FP33"}]})
    with pytest.raises(ValidationError):
        fits(ServerMetadata, {"name": "flightdeck", "version": "1", "extensions": [], "debug": True})
