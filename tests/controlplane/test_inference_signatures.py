"""/v2 over models with real-world signatures: scalars, strings, no batch axis, images of any size.

The models (tests/signature_models.py) are loaded into the app's own engine; requests go through
the Flask test client as JSON and as the binary-tensor extension.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from serving.codec import HEADER_LENGTH
from tests.signature_models import (
    image_reference,
    strings_reference,
    vad_reference,
    write_image,
    write_strings,
    write_vad,
)

IMAGE_BATCHING = {"max_batch_size": 4, "max_queue_delay_ms": 1.5, "preferred_batch_sizes": [2, 4], "instances": 1}


@pytest.fixture
def served(app, tmp_path: Path):
    """Load vad, strings and image (with its own batching values) into the app's engine."""
    engine = app.extensions["flightdeck"].engine
    engine.load(write_vad(tmp_path / "vad"))
    engine.load(write_strings(tmp_path / "strings"))
    warmup = [{"inputs": {"image": {"shape": [1, 3, 8, 8], "fill": "random"}}}]
    engine.load(write_image(tmp_path / "image", batching=IMAGE_BATCHING, warmup=warmup))
    return engine


def post(client, path: str, payload: dict | bytes, headers: dict | None = None):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return client.post(path, data=data, headers=headers or {}, content_type="application/json")


def tensor(name: str, datatype: str, array: np.ndarray) -> dict:
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel().tolist()}


def error_of(response) -> str:
    payload = response.get_json()
    assert set(payload) == {"error"}, payload
    return payload["error"]


# -- metadata and configuration -----------------------------------------------------------------


def test_metadata_shows_the_models_own_shapes_and_scalars_as_empty(client, served) -> None:
    meta = client.get("/v2/models/vad").get_json()
    assert meta["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "state", "datatype": "FP32", "shape": [2, -1, 8]},
        {"name": "sr", "datatype": "INT64", "shape": []},
    ]
    assert meta["outputs"][2] == {"name": "count", "datatype": "INT64", "shape": []}
    strings = client.get("/v2/models/strings").get_json()
    assert strings["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]


def test_config_of_a_model_without_a_batch_axis_has_max_batch_size_0_and_full_dims(client, served) -> None:
    config = client.get("/v2/models/vad/config").get_json()
    assert config["max_batch_size"] == 0
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("input", [-1, -1]), ("state", [2, -1, 8]), ("sr", [])]
    assert config["output"][2] == {"name": "count", "data_type": "TYPE_INT64", "dims": []}
    assert config["dynamic_batching"]["preferred_batch_size"] == []
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0  # nothing is merged, nobody waits


def test_config_shows_a_models_own_values_over_the_engines(client, served) -> None:
    config = client.get("/v2/models/image/config").get_json()
    assert config["max_batch_size"] == 4
    assert config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, -1, -1]}]
    batching = config["dynamic_batching"]
    assert batching["preferred_batch_size"] == [2, 4]
    assert batching["max_queue_delay_microseconds"] == 1500
    assert batching["default_queue_policy"]["max_queue_size"] == 128  # the engine's: the manifest sets none
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert config["model_warmup"] == [
        {
            "name": "sample_0",
            "count": 1,
            "inputs": {"image": {"data_type": "TYPE_FP32", "dims": [1, 3, 8, 8], "random_data": True}},
        }
    ]
    strings = client.get("/v2/models/strings/config").get_json()
    assert strings["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": []}]


# -- inference ----------------------------------------------------------------------------------


def test_a_scalar_input_and_output_over_json(client, served) -> None:
    rng = np.random.default_rng(1)
    audio, state, sr = rng.standard_normal((3, 9)).astype(np.float32), np.zeros((2, 3, 8), np.float32), np.array(16000)
    inputs = [tensor("input", "FP32", audio), tensor("state", "FP32", state), tensor("sr", "INT64", sr)]
    response = post(client, "/v2/models/vad/infer", {"inputs": inputs})
    assert response.status_code == 200, response.get_json()
    outputs = {o["name"]: o for o in response.get_json()["outputs"]}
    expected = vad_reference(audio, state, sr)
    assert outputs["count"] == {"name": "count", "datatype": "INT64", "shape": [], "data": [27]}
    assert outputs["stateN"]["shape"] == [2, 3, 8]
    got = np.array(outputs["stateN"]["data"], np.float32).reshape(2, 3, 8)
    np.testing.assert_allclose(got, expected["stateN"], rtol=1e-5, atol=1e-5)


def test_a_scalar_given_as_a_vector_is_a_400_naming_the_input(client, served) -> None:
    audio, state = np.zeros((1, 4), np.float32), np.zeros((2, 1, 8), np.float32)
    inputs = [tensor("input", "FP32", audio), tensor("state", "FP32", state)]
    inputs.append({"name": "sr", "datatype": "INT64", "shape": [1], "data": [16000]})
    response = post(client, "/v2/models/vad/infer", {"inputs": inputs})
    assert response.status_code == 400
    assert error_of(response) == "input 'sr' has shape [1], model expects rank 0 shape []"


def test_strings_over_json_and_over_the_binary_extension(client, served) -> None:
    words = ["yes", "héllo", "", "Ω"]
    expected = strings_reference(np.array(words, dtype=object))
    response = post(
        client,
        "/v2/models/strings/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [4], "data": words}]},
    )
    assert response.status_code == 200, response.get_json()
    outputs = {o["name"]: o for o in response.get_json()["outputs"]}
    assert outputs["marked"] == {
        "name": "marked",
        "datatype": "BYTES",
        "shape": [4],
        "data": expected["marked"].tolist(),
    }
    assert outputs["ids"]["data"] == expected["ids"].tolist()

    raw = b"".join(struct.pack("<I", len(w.encode())) + w.encode() for w in words)
    header = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [4], "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "marked", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    response = post(client, "/v2/models/strings/infer", head + raw, {HEADER_LENGTH: str(len(head))})
    assert response.status_code == 200, response.get_data()
    length = int(response.headers[HEADER_LENGTH])
    body = response.get_data()
    (out,) = json.loads(body[:length])["outputs"]
    assert (out["datatype"], out["shape"]) == ("BYTES", [4])
    marked, position = [], length
    while position < len(body):
        (size,) = struct.unpack_from("<I", body, position)
        marked.append(body[position + 4 : position + 4 + size].decode())
        position += 4 + size
    assert marked == expected["marked"].tolist()


def test_strings_that_are_not_utf8_are_a_400(client, served) -> None:
    raw = struct.pack("<I", 2) + b"\xff\xfe"
    header = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]}
    head = json.dumps(header).encode()
    response = post(client, "/v2/models/strings/infer", head + raw, {HEADER_LENGTH: str(len(head))})
    assert response.status_code == 400
    assert error_of(response) == "input 'text': BYTES element 0 is not UTF-8 text"


def test_images_of_different_sizes_over_binary_data(client, served) -> None:
    rng = np.random.default_rng(3)
    for h, w in ((5, 7), (12, 3), (20, 20)):
        image = rng.standard_normal((2, 3, h, w)).astype(np.float32)
        header = {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": [2, 3, h, w],
                    "parameters": {"binary_data_size": image.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        head = json.dumps(header).encode()
        response = post(client, "/v2/models/image/infer", head + image.tobytes(), {HEADER_LENGTH: str(len(head))})
        assert response.status_code == 200, response.get_data()
        length = int(response.headers[HEADER_LENGTH])
        body = response.get_data()
        outputs = json.loads(body[:length])["outputs"]
        assert outputs[0]["shape"] == [2, 2, h - 2, w - 2]  # dims that follow the input
        features = np.frombuffer(body[length : length + outputs[0]["parameters"]["binary_data_size"]], "<f4")
        expected = image_reference(image)["features"]
        np.testing.assert_allclose(features.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)
    # Over the model's own max batch size (4), even though the engine's is 32.
    too_many = np.zeros((5, 3, 4, 4), np.float32)
    response = post(client, "/v2/models/image/infer", {"inputs": [tensor("image", "FP32", too_many)]})
    assert response.status_code == 400
    assert error_of(response) == "batch size 5 is over the limit of 4 for 'image'"
