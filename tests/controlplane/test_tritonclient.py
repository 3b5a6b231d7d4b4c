"""Triton's own Python HTTP client, unchanged, against the real product (gunicorn on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_home
from tests.servers import Server, push_and_deploy, start_server
from tests.signature_models import strings_reference, vad_reference, write_strings, write_vad
from tests.tritonhttp import Client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator[Server]:
    """One server for the module: start-up (gunicorn, model loads, warm-up) is paid once."""
    home = tmp_path_factory.mktemp("tritonclient") / "home"
    copy_home(template_home, home)
    server = start_server(home, env={"FLIGHTDECK_SCHEDULER": "false", "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def triton(triton_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = Client(url=triton_server.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def reference(demo_store: Path) -> dict[str, ort.InferenceSession]:
    return {
        name: ort.InferenceSession(str(demo_store / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        for name in ("mlp", "textcls")
    }


def mlp_input(x: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def text_inputs(ids: np.ndarray, mask: np.ndarray) -> list[httpclient.InferInput]:
    tensors = []
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        tensor = httpclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    return tensors


def test_health(triton: httpclient.InferenceServerClient) -> None:
    assert triton.is_server_live() is True
    assert triton.is_server_ready() is True
    assert triton.is_model_ready("mlp") is True
    assert triton.is_model_ready("textcls", "1") is True
    assert triton.is_model_ready("resnet50") is False
    assert triton.is_model_ready("mlp", "9") is False


def test_server_metadata(triton: httpclient.InferenceServerClient) -> None:
    metadata = triton.get_server_metadata()
    assert metadata["name"] == "flightdeck"
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(metadata["extensions"])


def test_model_metadata(triton: httpclient.InferenceServerClient) -> None:
    mlp = triton.get_model_metadata("mlp")
    assert mlp["name"] == "mlp" and mlp["versions"] == ["1"] and mlp["platform"] == "onnxruntime_onnx"
    assert mlp["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert mlp["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]
    text = triton.get_model_metadata("textcls", model_version="1")
    assert [(t["name"], t["datatype"], t["shape"]) for t in text["inputs"]] == [
        ("input_ids", "INT64", [-1, -1]),
        ("attention_mask", "INT64", [-1, -1]),
    ]


def test_model_config(triton: httpclient.InferenceServerClient) -> None:
    config = triton.get_model_config("mlp")
    assert config["name"] == "mlp"
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [64]}]
    assert config["output"] == [{"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]}]


def test_infer_mlp_with_json_tensors(triton, reference) -> None:
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    result = triton.infer(
        "mlp",
        [mlp_input(x, binary=False)],
        outputs=[httpclient.InferRequestedOutput("probabilities", binary_data=False)],
        request_id="json-1",
    )
    response = result.get_response()
    assert response["id"] == "json-1" and response["model_name"] == "mlp" and response["model_version"] == "1"
    assert "data" in response["outputs"][0]  # came back as JSON
    probabilities = result.as_numpy("probabilities")
    assert probabilities.dtype == np.float32 and probabilities.shape == (3, 10)
    np.testing.assert_allclose(probabilities, reference["mlp"].run(None, {"input": x})[0], rtol=0, atol=1e-5)


def test_infer_mlp_with_binary_tensors(triton, reference) -> None:
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    # No outputs named: the client asks for every output as binary data.
    result = triton.infer("mlp", [mlp_input(x, binary=True)])
    output = result.get_output("probabilities")
    assert output["parameters"]["binary_data_size"] == 4 * 10 * 4
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), reference["mlp"].run(None, {"input": x})[0], rtol=0, atol=1e-5
    )


def test_infer_textcls_with_binary_tensors_and_a_padding_mask(triton, reference) -> None:
    rng = np.random.default_rng(3)
    ids = np.zeros((2, 12), dtype=np.int64)
    mask = np.zeros((2, 12), dtype=np.int64)
    ids[0] = rng.integers(1, 30000, size=12)
    mask[0] = 1
    ids[1, :7] = rng.integers(1, 30000, size=7)
    mask[1, :7] = 1
    result = triton.infer(
        "textcls",
        text_inputs(ids, mask),
        outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)],
    )
    logits = result.as_numpy("logits")
    assert logits.shape == (2, 3)
    expected = reference["textcls"].run(None, {"input_ids": ids, "attention_mask": mask})[0]
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-5)


def test_a_client_timeout_parameter_is_accepted(triton, reference) -> None:
    x = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)
    result = triton.infer("mlp", [mlp_input(x, binary=True)], timeout=5_000_000)
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), reference["mlp"].run(None, {"input": x})[0], rtol=0, atol=1e-5
    )


def test_inference_statistics(triton) -> None:
    before = triton.get_inference_statistics("mlp")["model_stats"][0]
    x = np.zeros((2, 64), dtype=np.float32)
    for _ in range(2):
        triton.infer("mlp", [mlp_input(x, binary=True)])
    after = triton.get_inference_statistics("mlp")["model_stats"][0]
    assert (after["name"], after["version"]) == ("mlp", "1")
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    every = triton.get_inference_statistics()["model_stats"]
    assert sorted(entry["name"] for entry in every) == ["mlp", "textcls"]


def test_an_unknown_model_raises_naming_it(triton) -> None:
    x = np.zeros((1, 64), dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        triton.infer("resnet50", [mlp_input(x, binary=True)])
    assert "resnet50" in info.value.message()
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException, match="resnet50"):
        triton.get_model_metadata("resnet50")


def test_a_bad_input_raises_with_the_servers_message(triton) -> None:
    x = np.zeros((1, 63), dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        triton.infer("mlp", [mlp_input(x, binary=True)])
    assert info.value.status() == "400"
    assert "axis 1 must be 64" in info.value.message()


# -- models with strings and scalars, pushed and deployed on the running server ------------------


@pytest.fixture(scope="module")
def signature_models(triton_server: Server, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Push the strings (BYTES) and vad (scalar, no batch axis) models through the API and deploy them."""
    from bench.rollout import operator_token

    builds = tmp_path_factory.mktemp("signature-archives")
    folders = [write(builds / write.__name__) for write in (write_strings, write_vad)]
    return push_and_deploy(triton_server, folders, operator_token(triton_server.home))


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors_through_tritonclient(triton, signature_models, binary: bool) -> None:
    words = np.array(["yes", "héllo", "", "no"], dtype=object)
    text = httpclient.InferInput("text", [4], "BYTES")
    text.set_data_from_numpy(words, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("marked", "is_yes", "ids")]
    result = triton.infer("strings", [text], outputs=outputs)
    expected = strings_reference(words)
    # tritonclient hands BYTES back as bytes objects (binary) or as the JSON strings.
    marked = [m.decode() if isinstance(m, bytes) else m for m in result.as_numpy("marked").tolist()]
    assert marked == expected["marked"].tolist()
    np.testing.assert_array_equal(result.as_numpy("is_yes"), expected["is_yes"])
    np.testing.assert_array_equal(result.as_numpy("ids"), expected["ids"])
    config = triton.get_model_config("strings")
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": []}]


def test_a_scalar_input_and_output_through_tritonclient(triton, signature_models) -> None:
    rng = np.random.default_rng(6)
    audio, state = rng.standard_normal((2, 32)).astype(np.float32), rng.standard_normal((2, 2, 8)).astype(np.float32)
    sr = np.array(16000, dtype=np.int64)
    inputs = []
    for name, array, datatype in (("input", audio, "FP32"), ("state", state, "FP32"), ("sr", sr, "INT64")):
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    result = triton.infer("vad", inputs)
    expected = vad_reference(audio, state, sr)
    assert result.as_numpy("count").shape == () and result.as_numpy("count").item() == 64
    np.testing.assert_allclose(result.as_numpy("stateN"), expected["stateN"], rtol=1e-5, atol=1e-5)
    metadata = triton.get_model_metadata("vad")
    assert [t["shape"] for t in metadata["inputs"]] == [[-1, -1], [2, -1, 8], []]
    assert triton.get_model_config("vad")["max_batch_size"] == 0
