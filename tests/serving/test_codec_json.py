"""The codec's JSON goes through orjson where it is faster, and reads and writes the same values as json."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from serving.codec import OutputRequest, decode_request, encode_response
from serving.errors import InvalidInput


def _encoded(results: dict[str, np.ndarray]) -> bytes:
    body, length = encode_response("m", "1", "r-1", results, [OutputRequest(n, binary=False) for n in results])
    assert length is None
    return body


def _reference(results: dict[str, np.ndarray]) -> dict:
    """What the codec wrote with json.dumps alone, as a reader sees it."""
    outputs = [
        {"name": n, "datatype": d, "shape": list(a.shape), "data": a.ravel().tolist()}
        for (n, a), d in zip(results.items(), ("FP32", "FP64", "INT64"), strict=False)
    ]
    return json.loads(json.dumps({"model_name": "m", "model_version": "1", "outputs": outputs, "id": "r-1"}))


def test_outputs_read_back_as_exactly_the_values_json_wrote() -> None:
    rng = np.random.default_rng(7)
    results = {
        "f32": (rng.standard_normal((3, 17)) * 10.0 ** rng.integers(-12, 12, (3, 17))).astype(np.float32),
        "f64": rng.standard_normal(40) * 1e-300,
        "i64": rng.integers(-(2**63), 2**63 - 1, 9, dtype=np.int64),
    }
    results["f32"][0, :3] = [0.1, -0.0, 1e-5]
    assert json.loads(_encoded(results)) == _reference(results)  # float == float: bit for bit


def test_non_finite_outputs_are_written_as_json_always_wrote_them() -> None:
    results = {"f32": np.array([[np.nan, np.inf, -np.inf, 0.5]], dtype=np.float32)}
    body = _encoded(results)
    assert b"[NaN,Infinity,-Infinity,0.5]" in body  # not null, which orjson would write
    data = json.loads(body)["outputs"][0]["data"]
    assert math.isnan(data[0]) and data[1:] == [math.inf, -math.inf, 0.5]


def test_text_outputs_keep_their_characters() -> None:
    marked = np.empty(3, dtype=object)
    marked[:] = ["héllo", "日本", "\ud800 alone"]  # a lone surrogate: orjson refuses it, json escapes it
    data = json.loads(_encoded({"marked": marked}))["outputs"][0]["data"]
    assert data == ["héllo", "日本", "\ud800 alone"]


def _inputs(data: str, datatype: str = "FP32") -> bytes:
    return f'{{"inputs": [{{"name": "x", "datatype": "{datatype}", "shape": [2], "data": {data}}}]}}'.encode()


def test_bodies_orjson_refuses_are_read_as_json_reads_them() -> None:
    nan = decode_request(_inputs("[NaN, 1.5]")).tensors["x"]
    assert math.isnan(nan[0]) and nan[1] == 1.5
    assert decode_request(b"\xef\xbb\xbf" + _inputs("[1, 2]")).tensors["x"].tolist() == [1.0, 2.0]  # a UTF-8 BOM
    assert decode_request(_inputs("[1e400, 0]", "FP64")).tensors["x"].tolist() == [math.inf, 0.0]
    with pytest.raises(InvalidInput, match=r"^malformed JSON: Expecting value: line 1 column 2 \(char 1\)$"):
        decode_request(b"[,]")


def test_integers_past_64_bits_stay_exact_so_their_refusal_names_the_range() -> None:
    # orjson would read 2**64 as a float: a float tensor would take it, and INT64's refusal would call it a fraction.
    with pytest.raises(InvalidInput, match=r"holds null or mixed values"):
        decode_request(_inputs(f"[{2**64}, 1]"))
    with pytest.raises(InvalidInput, match=r"holds null or mixed values"):
        decode_request(_inputs(f"[{2**70}, 1]", "INT64"))
    assert decode_request(_inputs(f"[{2**63 - 1}, 1]", "INT64")).tensors["x"].tolist() == [2**63 - 1, 1]
