"""The codec for every datatype ONNX Runtime takes: scalars, BYTES (strings) both ways, JSON and binary."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from serving.codec import OutputRequest, decode_request, encode_response
from serving.errors import InvalidInput

# Little-endian wire dtypes, written out here so a wrong table in serving.tensors shows.
NUMERIC_WIRE = {
    "BOOL": "?",
    "UINT8": "u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}


def edge_values(datatype: str) -> np.ndarray:
    """Two rows of values at the datatype's edges."""
    dtype = np.dtype(NUMERIC_WIRE[datatype])
    if dtype.kind == "b":
        return np.array([[True, False], [False, True]])
    if dtype.kind == "f":
        info = np.finfo(dtype)
        return np.array([[info.max, info.tiny], [-1.5, 0.0]], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, info.max], [0, 1]], dtype=dtype)


def serialize_strings(values: list[bytes]) -> bytes:
    """Triton's BYTES serialization: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def binary_body(inputs: list[dict], raw: bytes) -> tuple[bytes, int]:
    head = json.dumps({"inputs": inputs}).encode()
    return head + raw, len(head)


def refused(body: bytes, header_length: int | None = None) -> str:
    with pytest.raises(InvalidInput) as info:
        decode_request(body, header_length)
    assert info.value.status == 400
    return info.value.message


@pytest.mark.parametrize("datatype", list(NUMERIC_WIRE))
def test_every_numeric_datatype_decodes_from_json_and_binary_alike(datatype: str) -> None:
    values = edge_values(datatype)
    entry = {"name": "t", "datatype": datatype, "shape": [2, 2]}
    from_json = decode_request(json.dumps({"inputs": [{**entry, "data": values.ravel().tolist()}]}).encode())
    raw = values.astype(NUMERIC_WIRE[datatype]).tobytes()
    body, length = binary_body([{**entry, "parameters": {"binary_data_size": len(raw)}}], raw)
    from_binary = decode_request(body, length)
    for decoded in (from_json.tensors["t"], from_binary.tensors["t"]):
        assert decoded.dtype == np.dtype(NUMERIC_WIRE[datatype]).newbyteorder("=")
        assert decoded.tolist() == values.tolist()


@pytest.mark.parametrize("datatype", list(NUMERIC_WIRE))
def test_every_numeric_datatype_encodes_to_json_and_binary_exactly(datatype: str) -> None:
    values = edge_values(datatype).astype(np.dtype(NUMERIC_WIRE[datatype]).newbyteorder("="))
    body, length = encode_response("m", "1", None, {"y": values}, [OutputRequest("y", binary=True)])
    header = json.loads(body[:length])
    (out,) = header["outputs"]
    assert (out["datatype"], out["shape"]) == (datatype, [2, 2])
    assert np.frombuffer(body[length:], NUMERIC_WIRE[datatype]).reshape(2, 2).tolist() == values.tolist()
    body, length = encode_response("m", "1", None, {"y": values}, [OutputRequest("y", binary=False)])
    assert length is None and json.loads(body)["outputs"][0]["data"] == values.ravel().tolist()


# -- scalars ------------------------------------------------------------------------------------


def test_a_scalar_input_has_shape_empty_and_one_value() -> None:
    decoded = decode_request(b'{"inputs": [{"name": "sr", "datatype": "INT64", "shape": [], "data": [16000]}]}')
    assert decoded.tensors["sr"].shape == () and decoded.tensors["sr"].item() == 16000
    raw = struct.pack("<q", 8000)
    body, length = binary_body(
        [{"name": "sr", "datatype": "INT64", "shape": [], "parameters": {"binary_data_size": 8}}], raw
    )
    assert decode_request(body, length).tensors["sr"].shape == ()
    message = refused(b'{"inputs": [{"name": "sr", "datatype": "INT64", "shape": [], "data": [1, 2]}]}')
    assert message == "input 'sr': 2 values given, shape [] needs 1"


def test_a_scalar_output_keeps_shape_empty_in_json_and_binary() -> None:
    results = {"count": np.array(7, dtype=np.int64)}
    body, _ = encode_response("m", "1", None, results, [OutputRequest("count", binary=False)])
    assert json.loads(body)["outputs"][0] == {"name": "count", "datatype": "INT64", "shape": [], "data": [7]}
    body, length = encode_response("m", "1", None, results, [OutputRequest("count", binary=True)])
    assert json.loads(body[:length])["outputs"][0]["shape"] == [] and body[length:] == struct.pack("<q", 7)


# -- BYTES --------------------------------------------------------------------------------------


def test_json_strings_decode_to_an_object_array_of_str_flat_or_nested() -> None:
    entry = {"name": "text", "datatype": "BYTES", "shape": [2, 2]}
    flat = decode_request(json.dumps({"inputs": [{**entry, "data": ["a", "héllo", "", "Ω"]}]}).encode())
    nested = decode_request(json.dumps({"inputs": [{**entry, "data": [["a", "héllo"], ["", "Ω"]]}]}).encode())
    for decoded in (flat, nested):
        array = decoded.tensors["text"]
        assert array.dtype == object and array.shape == (2, 2)
        assert array.tolist() == [["a", "héllo"], ["", "Ω"]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["a", 3], "input 'text': data does not fit datatype BYTES: every element must be a string"),
        (["a", None], "input 'text': data does not fit datatype BYTES: every element must be a string"),
        (["a"], "input 'text': 1 values given, shape [2] needs 2"),
        ("ab", "input 'text': 'data' must be a list"),
    ],
)
def test_json_strings_that_do_not_fit_are_refused(data: object, message: str) -> None:
    body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": data}]}).encode()
    assert refused(body) == message


def test_deeply_nested_json_is_refused_not_a_server_error() -> None:
    deep = "[" * 100_000 + '"a"' + "]" * 100_000
    body = ('{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ' + deep + "}]}").encode()
    assert refused(body) == "malformed JSON: nested too deeply"


def test_binary_strings_are_length_prefixed_utf8() -> None:
    words = ["yes", "", "héllo wörld"]
    raw = serialize_strings([w.encode() for w in words])
    inputs = [
        {"name": "text", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(raw)}},
        {"name": "sr", "datatype": "INT64", "shape": [], "parameters": {"binary_data_size": 8}},
    ]
    body, length = binary_body(inputs, raw + struct.pack("<q", 5))
    decoded = decode_request(body, length)
    assert decoded.tensors["text"].dtype == object and decoded.tensors["text"].tolist() == words
    assert decoded.tensors["sr"].item() == 5  # the input after the strings is found where it starts


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (serialize_strings([b"ok", b"\xff\xfe"]), "input 'text': BYTES element 1 is not UTF-8 text"),
        (serialize_strings([b"ok"]) + b"\x01\x00", "input 'text': BYTES data ends before element 1's length"),
        (serialize_strings([b"ok"]) + struct.pack("<I", 9) + b"abc", "BYTES element 1 needs 9 bytes, 3 left"),
        (serialize_strings([b"ok", b"no", b"extra"]), "binary_data_size is 21 bytes but the elements use 12"),
    ],
)
def test_binary_strings_that_do_not_parse_are_refused(raw: bytes, message: str) -> None:
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(raw)}}]
    body, length = binary_body(inputs, raw)
    assert message in refused(body, length)


def test_binary_strings_longer_than_the_body_are_refused() -> None:
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 50}}]
    body, length = binary_body(inputs, serialize_strings([b"short"]))
    assert refused(body, length) == "input 'text': binary data ends after 9 of 50 bytes"


def test_string_outputs_encode_as_json_strings_and_as_length_prefixed_binary() -> None:
    marked = np.empty(3, dtype=object)
    marked[:] = ["YES!", "héllo", ""]
    body, _ = encode_response("m", "1", None, {"marked": marked}, [OutputRequest("marked", binary=False)])
    assert json.loads(body)["outputs"][0] == {
        "name": "marked",
        "datatype": "BYTES",
        "shape": [3],
        "data": ["YES!", "héllo", ""],
    }
    body, length = encode_response("m", "1", None, {"marked": marked}, [OutputRequest("marked", binary=True)])
    raw = serialize_strings([b"YES!", "héllo".encode(), b""])
    assert body[length:] == raw
    assert json.loads(body[:length])["outputs"][0]["parameters"] == {"binary_data_size": len(raw)}


def test_uint64_values_past_int64_come_through_json_exactly_and_overflow_is_refused() -> None:
    entry = {"name": "t", "datatype": "UINT64", "shape": [2]}
    decoded = decode_request(json.dumps({"inputs": [{**entry, "data": [2**64 - 1, 3]}]}).encode())
    assert decoded.tensors["t"].tolist() == [2**64 - 1, 3]
    message = refused(json.dumps({"inputs": [{**entry, "data": [2**64, 3]}]}).encode())
    assert message == f"input 't': data does not fit datatype UINT64: a value is outside [0, {2**64 - 1}]"


def test_int64_takes_its_whole_range_from_json_and_refuses_one_past_either_end() -> None:
    """INT64's ends from JSON: both ends exactly, one past either refused (numpy reads those as floats, so this
    guards the decoder's boundary; the range check's own skip is guarded by the narrower types' refusals)."""
    entry = {"name": "t", "datatype": "INT64", "shape": [2]}
    decoded = decode_request(json.dumps({"inputs": [{**entry, "data": [-(2**63), 2**63 - 1]}]}).encode())
    assert decoded.tensors["t"].tolist() == [-(2**63), 2**63 - 1]
    for past in ([2**63, 0], [-(2**63) - 1, 0]):
        message = refused(json.dumps({"inputs": [{**entry, "data": past}]}).encode())
        assert "input 't': data does not fit datatype INT64" in message, (past, message)
