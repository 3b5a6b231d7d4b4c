"""Two ways a user calls a served model: Triton's own HTTP client, and raw Open Inference Protocol JSON."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.tritonhttp import Client

Inputs = dict[str, np.ndarray]
DATATYPE_TO_NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}


@dataclass
class Answer:
    """What the server said: a status, the outputs on success, the error text otherwise."""

    status: int
    outputs: Inputs
    error: str = ""


def infer_triton(url: str, model: str, inputs: Inputs) -> Answer:
    """Infer through tritonclient.http, with binary tensors both ways."""
    # NOTE: one client per call: the client is not meant to be shared between threads.
    client = Client(url=url.removeprefix("http://"), network_timeout=120)
    try:
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        try:
            result = client.infer(model, tensors)
        except InferenceServerException as exc:
            return Answer(int(exc.status() or 0), {}, exc.message())
        response = result.get_response()
        return Answer(200, {o["name"]: result.as_numpy(o["name"]) for o in response["outputs"]})
    finally:
        client.close()


def tensor_json(name: str, array: np.ndarray, datatype: str | None = None, shape: Sequence[int] | None = None) -> dict:
    """One OIP JSON input; `datatype`/`shape` may lie about the array, to make a bad request."""
    return {
        "name": name,
        "datatype": datatype or np_to_triton_dtype(array.dtype),
        "shape": list(array.shape if shape is None else shape),
        "data": array.reshape(-1).tolist(),
    }


def infer_json(url: str, model: str, inputs: Inputs | list[dict[str, Any]]) -> Answer:
    """Infer with a raw OIP JSON body (or with hand-made input entries) and decode the answer."""
    entries = inputs if isinstance(inputs, list) else [tensor_json(n, a) for n, a in inputs.items()]
    response = requests.post(f"{url}/v2/models/{model}/infer", json={"inputs": entries}, timeout=120)
    body = response.json()
    if response.status_code != 200:
        return Answer(response.status_code, {}, body.get("error", ""))
    outputs = {
        o["name"]: np.asarray(o["data"], dtype=DATATYPE_TO_NUMPY[o["datatype"]]).reshape(o["shape"])
        for o in body["outputs"]
    }
    return Answer(200, outputs)


def describe(url: str, model: str) -> tuple[dict, dict]:
    """Return the model's metadata and configuration, as Triton's HTTP client reads them."""
    client = Client(url=url.removeprefix("http://"))
    try:
        return client.get_model_metadata(model), client.get_model_config(model)
    finally:
        client.close()


def infer_interleaved(
    url: str,
    model: str,
    payloads: Sequence[Inputs],
    senders: Sequence[Callable[..., Answer]] = (infer_json, infer_triton),
) -> list[Answer]:
    """Send every request at once from 32 clients, taking turns through `senders` so each way meets the others in batches."""
    calls = [functools.partial(senders[i % len(senders)], url, model, p) for i, p in enumerate(payloads)]
    return run_concurrently(calls, threads=32)


def run_concurrently(calls: Sequence[Callable[[], Any]], threads: int = 32) -> list[Any]:
    """Run every call on a pool of `threads` client threads at once; return the results in order."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda call: call(), calls))


def assert_matches(answer: Answer, expected: Inputs, what: str, atol: float = 1e-4, rtol: float = 1e-3) -> None:
    """Assert the server answered 200 with every expected output, equal to plain ONNX Runtime's within tolerance."""
    assert answer.status == 200, f"{what}: {answer.status} {answer.error}"
    assert set(answer.outputs) == set(expected), f"{what}: outputs {sorted(answer.outputs)}"
    for name, want in expected.items():
        got = answer.outputs[name]
        assert got.shape == want.shape, f"{what}: output {name} has shape {got.shape}, ORT gives {want.shape}"
        assert got.dtype == want.dtype, f"{what}: output {name} is {got.dtype}, ORT gives {want.dtype}"
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=f"{what}: output {name}")
