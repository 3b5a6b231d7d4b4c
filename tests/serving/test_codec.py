"""The Open Inference Protocol codec: JSON tensors, the binary-tensor extension, and every refusal."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from serving.codec import HEADER_LENGTH, OutputRequest, decode_request, encode_response, select_outputs
from serving.errors import InvalidInput

# The wire datatypes this file uses, mapped independently of serving.tensors so a wrong table there shows.
WIRE = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


def json_body(payload: object) -> bytes:
    return json.dumps(payload).encode()


def binary_request(header: dict, *arrays: np.ndarray) -> tuple[bytes, int]:
    """Return (body, header length): a JSON header followed by each array's little-endian bytes."""
    head = json.dumps(header).encode()
    raw = b"".join(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes() for a in arrays)
    return head + raw, len(head)


def binary_input(name: str, datatype: str, array: np.ndarray) -> dict:
    size = array.size * WIRE[datatype].itemsize
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "parameters": {"binary_data_size": size}}


def parse_response(body: bytes, header_length: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """Parse a response the way a client does: JSON outputs from 'data', binary ones from the tail."""
    header = json.loads(body if header_length is None else body[:header_length])
    offset = 0 if header_length is None else header_length
    arrays = {}
    for out in header["outputs"]:
        dtype = WIRE[out["datatype"]]
        if "data" in out:
            arrays[out["name"]] = np.array(out["data"], dtype=dtype).reshape(out["shape"])
            continue
        size = out["parameters"]["binary_data_size"]
        arrays[out["name"]] = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(out["shape"])
        offset += size
    assert offset == (len(body) if header_length is not None else 0), "response bytes left over or missing"
    return header, arrays


def refused(body: bytes, header_length: int | None = None) -> str:
    """Decode a request that must be refused; return the message."""
    with pytest.raises(InvalidInput) as info:
        decode_request(body, header_length)
    assert info.value.status == 400
    return info.value.message


def one_input(**fields) -> bytes:
    entry = {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}
    entry.update(fields)
    return json_body({"inputs": [entry]})


# -- JSON tensors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("FP32", [0.5, -1.25, 3.0, 1e-3], np.array([0.5, -1.25, 3.0, 1e-3], dtype=np.float32)),
        ("INT64", [1, -2, 2**40, 9007199254740993], np.array([1, -2, 2**40, 9007199254740993], dtype=np.int64)),
        ("BOOL", [True, False, False, True], np.array([True, False, False, True])),
        ("FP16", [0.5, -2.0, 65504.0, 0.0009765625], np.array([0.5, -2.0, 65504.0, 0.0009765625], dtype=np.float16)),
        ("UINT8", [0, 1, 128, 255], np.array([0, 1, 128, 255], dtype=np.uint8)),
    ],
)
def test_flat_json_data_decodes_to_the_datatype_and_shape(datatype: str, data: list, expected: np.ndarray) -> None:
    request = decode_request(
        json_body({"inputs": [{"name": "t", "datatype": datatype, "shape": [2, 2], "data": data}]})
    )
    array = request.tensors["t"]
    assert array.dtype == WIRE[datatype]
    assert array.shape == (2, 2)
    np.testing.assert_array_equal(array, expected.reshape(2, 2))


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "UINT8"])
def test_nested_json_data_decodes_like_flat_data(datatype: str) -> None:
    nested = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]]
    flat = list(range(1, 13))
    shape = [2, 3, 2]
    a = decode_request(json_body({"inputs": [{"name": "t", "datatype": datatype, "shape": shape, "data": nested}]}))
    b = decode_request(json_body({"inputs": [{"name": "t", "datatype": datatype, "shape": shape, "data": flat}]}))
    assert a.tensors["t"].shape == (2, 3, 2) and a.tensors["t"].dtype == WIRE[datatype]
    np.testing.assert_array_equal(a.tensors["t"], b.tensors["t"])
    assert a.tensors["t"][1, 2, 1] == 12


def test_nested_bool_data_keeps_its_layout() -> None:
    request = decode_request(
        json_body(
            {"inputs": [{"name": "m", "datatype": "BOOL", "shape": [2, 2], "data": [[True, False], [False, False]]}]}
        )
    )
    np.testing.assert_array_equal(request.tensors["m"], np.array([[True, False], [False, False]]))


def test_request_id_parameters_and_several_inputs_are_kept() -> None:
    request = decode_request(
        json_body(
            {
                "id": 42,
                "parameters": {"custom": "yes"},
                "inputs": [
                    {"name": "a", "datatype": "INT64", "shape": [1, 2], "data": [7, 8]},
                    {"name": "b", "datatype": "FP32", "shape": [1], "data": [0.25]},
                ],
            }
        )
    )
    assert request.id == "42"
    assert request.parameters == {"custom": "yes"}
    assert list(request.tensors) == ["a", "b"]
    np.testing.assert_array_equal(request.tensors["a"], [[7, 8]])
    assert request.tensors["b"].dtype == np.float32 and request.tensors["b"][0] == 0.25
    assert request.outputs is None and request.binary_output is False
    assert request.timeout_us is None


def test_a_request_without_id_decodes_with_none() -> None:
    assert decode_request(one_input()).id is None


# -- binary tensors -----------------------------------------------------------------------------


def test_binary_input_is_read_as_little_endian_bytes_after_the_header() -> None:
    header = json.dumps(
        {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}}]}
    ).encode()
    raw = struct.pack("<3q", 1, -2, 2**40 + 5)
    request = decode_request(header + raw, len(header))
    assert request.tensors["ids"].dtype == np.int64
    np.testing.assert_array_equal(request.tensors["ids"], [[1, -2, 2**40 + 5]])


def test_several_binary_inputs_are_read_in_the_order_listed() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    ids = rng.integers(-(2**62), 2**62, size=(2, 3), dtype=np.int64)
    half = rng.standard_normal((4,)).astype(np.float16)
    mask = np.array([[True, False, True]])
    body, length = binary_request(
        {
            "inputs": [
                binary_input("x", "FP32", x),
                binary_input("ids", "INT64", ids),
                binary_input("half", "FP16", half),
                binary_input("mask", "BOOL", mask),
            ]
        },
        x,
        ids,
        half,
        mask,
    )
    request = decode_request(body, length)
    for name, expected in {"x": x, "ids": ids, "half": half, "mask": mask}.items():
        got = request.tensors[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected)


def test_json_and_binary_inputs_mix_in_one_request() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    scores = np.array([0.5, 1.5], dtype=np.float32)
    header = {
        "inputs": [
            {"name": "first", "datatype": "UINT8", "shape": [2], "data": [3, 4]},
            binary_input("ids", "INT64", ids),
            {"name": "middle", "datatype": "BOOL", "shape": [1], "data": [True]},
            binary_input("scores", "FP32", scores),
        ]
    }
    body, length = binary_request(header, ids, scores)
    request = decode_request(body, length)
    np.testing.assert_array_equal(request.tensors["first"], np.array([3, 4], dtype=np.uint8))
    np.testing.assert_array_equal(request.tensors["ids"], ids)
    np.testing.assert_array_equal(request.tensors["middle"], [True])
    np.testing.assert_array_equal(request.tensors["scores"], scores)


def test_header_length_covering_the_whole_body_is_a_plain_json_request() -> None:
    body = one_input()
    request = decode_request(body, len(body))
    np.testing.assert_array_equal(request.tensors["x"], np.arange(1, 7, dtype=np.float32).reshape(2, 3))


# -- responses ----------------------------------------------------------------------------------


RESULTS = {
    "probs": np.array([[0.1, 0.2, 0.7], [1 / 3, 1 / 3, 1 / 3]], dtype=np.float32),
    "ids": np.array([[2**40, -1]], dtype=np.int64),
    "flags": np.array([True, False, True]),
    "half": np.array([[0.5, -1.0]], dtype=np.float16),
}


def test_json_response_round_trips_every_value_exactly() -> None:
    wanted = [OutputRequest(name, binary=False) for name in RESULTS]
    body, header_length = encode_response("m", "3", "req-1", RESULTS, wanted)
    assert header_length is None
    header, arrays = parse_response(body, None)
    assert (header["model_name"], header["model_version"], header["id"]) == ("m", "3", "req-1")
    assert [o["name"] for o in header["outputs"]] == list(RESULTS)
    assert [o["datatype"] for o in header["outputs"]] == ["FP32", "INT64", "BOOL", "FP16"]
    assert [o["shape"] for o in header["outputs"]] == [[2, 3], [1, 2], [3], [1, 2]]
    assert all("parameters" not in o for o in header["outputs"])
    for name, expected in RESULTS.items():
        np.testing.assert_array_equal(arrays[name], expected)


def test_binary_response_round_trips_every_value_exactly() -> None:
    wanted = [OutputRequest(name, binary=True) for name in RESULTS]
    body, header_length = encode_response("m", "3", None, RESULTS, wanted)
    assert header_length is not None and header_length < len(body)
    header, arrays = parse_response(body, header_length)
    assert "id" not in header
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes == [24, 16, 3, 4]
    assert all("data" not in o for o in header["outputs"])
    for name, expected in RESULTS.items():
        assert arrays[name].dtype == expected.dtype
        np.testing.assert_array_equal(arrays[name], expected)


def test_binary_and_json_outputs_mix_in_one_response() -> None:
    wanted = [OutputRequest("ids", binary=True), OutputRequest("probs", binary=False), OutputRequest("half", True)]
    body, header_length = encode_response("m", "1", None, RESULTS, wanted)
    header, arrays = parse_response(body, header_length)
    assert [o["name"] for o in header["outputs"]] == ["ids", "probs", "half"]
    assert "data" in header["outputs"][1] and "data" not in header["outputs"][0]
    assert len(body) == header_length + 16 + 4
    for name in ("ids", "probs", "half"):
        np.testing.assert_array_equal(arrays[name], RESULTS[name])


def test_a_non_contiguous_result_is_sent_in_logical_order() -> None:
    results = {"t": np.arange(6, dtype=np.int64).reshape(2, 3).T}
    body, header_length = encode_response("m", "1", None, results, [OutputRequest("t", True)])
    _, arrays = parse_response(body, header_length)
    np.testing.assert_array_equal(arrays["t"], [[0, 3], [1, 4], [2, 5]])


def test_decode_select_encode_round_trip_with_binary_data_output() -> None:
    request = decode_request(
        json_body(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "id": "r9",
                "parameters": {"binary_data_output": True},
            }
        )
    )
    wanted = select_outputs(request, ["probs", "ids"])
    assert wanted == [OutputRequest("probs", True), OutputRequest("ids", True)]
    body, header_length = encode_response("m", "1", request.id, RESULTS, wanted)
    header, arrays = parse_response(body, header_length)
    assert header["id"] == "r9"
    np.testing.assert_array_equal(arrays["probs"], RESULTS["probs"])
    np.testing.assert_array_equal(arrays["ids"], RESULTS["ids"])


# -- binary_data_output and requested outputs ---------------------------------------------------


def test_without_parameters_every_output_is_json_in_model_order() -> None:
    request = decode_request(one_input())
    assert select_outputs(request, ["a", "b"]) == [OutputRequest("a", False), OutputRequest("b", False)]


def test_binary_data_output_is_the_default_for_requested_outputs_and_each_may_override_it() -> None:
    request = decode_request(
        json_body(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "parameters": {"binary_data_output": True},
                "outputs": [{"name": "b"}, {"name": "a", "parameters": {"binary_data": False}}],
            }
        )
    )
    assert request.binary_output is True
    assert select_outputs(request, ["a", "b", "c"]) == [OutputRequest("b", True), OutputRequest("a", False)]


def test_a_requested_output_may_ask_for_binary_on_its_own() -> None:
    request = decode_request(
        json_body(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "outputs": [{"name": "c", "parameters": {"binary_data": True}}, {"name": "a"}],
            }
        )
    )
    assert request.binary_output is False
    assert select_outputs(request, ["a", "b", "c"]) == [OutputRequest("c", True), OutputRequest("a", False)]


def test_requested_outputs_keep_the_clients_subset_and_order() -> None:
    request = decode_request(
        json_body(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "outputs": [{"name": "half"}, {"name": "probs"}],
            }
        )
    )
    wanted = select_outputs(request, list(RESULTS))
    body, _ = encode_response("m", "1", None, RESULTS, wanted)
    assert [o["name"] for o in json.loads(body)["outputs"]] == ["half", "probs"]


def test_an_unknown_requested_output_is_refused_by_name() -> None:
    request = decode_request(
        json_body(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "outputs": [{"name": "probs"}, {"name": "embeddings"}],
            }
        )
    )
    with pytest.raises(InvalidInput) as info:
        select_outputs(request, ["probs", "ids"])
    assert "embeddings" in info.value.message and "probs" not in info.value.message.split(";")[0]
    assert "['probs', 'ids']" in info.value.message


def test_outputs_must_be_a_list() -> None:
    body = json_body({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "outputs": "probs"})
    assert "'outputs' must be a list" in refused(body)


def test_each_requested_output_needs_a_name() -> None:
    body = json_body({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "outputs": [{}]})
    assert "requested output needs a string 'name'" in refused(body)


# -- the timeout parameter ----------------------------------------------------------------------


def with_parameters(parameters: object) -> bytes:
    return json_body(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "parameters": parameters}
    )


@pytest.mark.parametrize("value", [1, 1500, 10_000_000])
def test_timeout_is_read_in_microseconds(value: int) -> None:
    assert decode_request(with_parameters({"timeout": value})).timeout_us == value


@pytest.mark.parametrize("value", [True, False, 0, -5, "1000", 1.5, [1000]])
def test_timeout_that_is_not_a_positive_integer_is_refused(value: object) -> None:
    request = decode_request(with_parameters({"timeout": value}))
    with pytest.raises(InvalidInput) as info:
        _ = request.timeout_us
    assert "parameter 'timeout' must be a positive integer of microseconds" in info.value.message
    assert repr(value) in info.value.message


def test_request_parameters_must_be_an_object() -> None:
    assert "'parameters' must be a JSON object" in refused(with_parameters(["timeout", 5]))


# -- malformed requests, one problem each -------------------------------------------------------


def test_malformed_json_is_refused() -> None:
    assert refused(b'{"inputs": [{"name": "x",').startswith("malformed JSON")


def test_body_that_is_not_utf8_is_refused_as_malformed_json() -> None:
    assert refused(b"\xff\xfe{}").startswith("malformed JSON")


def test_empty_body_is_refused_as_malformed_json() -> None:
    assert refused(b"").startswith("malformed JSON")


@pytest.mark.parametrize("payload", [[{"name": "x"}], "inputs", 7, None])
def test_body_that_is_not_an_object_is_refused(payload: object) -> None:
    assert refused(json_body(payload)) == "request body must be a JSON object"


@pytest.mark.parametrize("payload", [{}, {"inputs": None}, {"inputs": {"name": "x"}}])
def test_missing_inputs_are_refused(payload: dict) -> None:
    assert refused(json_body(payload)) == "'inputs' must be a non-empty list"


def test_empty_inputs_are_refused() -> None:
    assert refused(json_body({"inputs": []})) == "'inputs' must be a non-empty list"


def test_an_input_that_is_not_an_object_is_refused() -> None:
    assert refused(json_body({"inputs": ["x"]})) == "each input must be a JSON object"


@pytest.mark.parametrize("name", [None, "", 5])
def test_an_input_without_a_name_is_refused(name: object) -> None:
    entry = {"datatype": "FP32", "shape": [1], "data": [1]}
    if name is not None:
        entry["name"] = name
    assert refused(json_body({"inputs": [entry]})) == "each input needs a string 'name'"


def test_duplicate_input_names_are_refused() -> None:
    entry = {"name": "ids", "datatype": "INT64", "shape": [1], "data": [1]}
    assert refused(json_body({"inputs": [entry, entry]})) == "input 'ids' is given twice"


@pytest.mark.parametrize("datatype", ["FP8", "float32", "STRING", None, 3])
def test_an_unknown_datatype_is_refused(datatype: object) -> None:
    message = refused(one_input(datatype=datatype))
    assert message.startswith(f"input 'x': unsupported datatype {datatype!r}")
    assert "FP32" in message and "INT64" in message  # says what is supported


@pytest.mark.parametrize("shape", ["2,3", None, [2, "3"], [2.0, 3], [True, 6], {"0": 2}])
def test_a_shape_that_is_not_a_list_of_integers_is_refused(shape: object) -> None:
    assert refused(one_input(shape=shape)) == "input 'x': 'shape' must be a list of integers"


def test_a_negative_dimension_is_refused() -> None:
    assert refused(one_input(shape=[-1, 3])) == "input 'x': shape [-1, 3] has a negative dimension"


@pytest.mark.parametrize(("shape", "count"), [([2, 3], 5), ([2, 3], 7), ([6, 1], 12), ([0, 3], 1)])
def test_data_count_not_matching_the_shape_is_refused(shape: list[int], count: int) -> None:
    message = refused(one_input(shape=shape, data=list(range(count))))
    needed = shape[0] * shape[1]
    assert message == f"input 'x': {count} values given, shape {shape} needs {needed}"


def test_data_that_is_not_a_list_is_refused() -> None:
    assert refused(one_input(data="1,2,3,4,5,6")) == "input 'x': 'data' must be a list"


def test_missing_data_without_binary_size_is_refused() -> None:
    entry = {"name": "x", "datatype": "FP32", "shape": [2]}
    assert refused(json_body({"inputs": [entry]})) == "input 'x': 'data' must be a list"


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("INT64", ["one", "two"]),
        ("FP32", ["a", "b"]),
        ("INT64", [{"v": 1}, {"v": 2}]),
        ("UINT8", [256, 1]),
        ("UINT8", [-1, 1]),
        ("INT64", [2**63, 1]),
        ("FP32", [[1, 2], [3]]),
    ],
)
def test_data_of_the_wrong_kind_is_refused(datatype: str, data: list) -> None:
    body = json_body({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": data}]})
    assert refused(body).startswith(f"input 'x': data does not fit datatype {datatype}")


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("INT64", ["1", "2"]),  # strings accepted as integers
        ("INT64", [1.5, 2.7]),  # silently truncated to 1, 2
        ("FP32", [None, 1.0]),  # null becomes NaN
        ("FP32", ["1.5", "2"]),  # strings accepted as floats
        ("BOOL", ["false", "true"]),  # any non-empty string is True
    ],
    ids=["int64-numeric-strings", "int64-fractions", "fp32-null", "fp32-strings", "bool-strings"],
)
def test_json_values_of_the_wrong_kind_are_not_coerced(datatype: str, data: list) -> None:
    body = json_body({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": data}]})
    assert refused(body).startswith(f"input 'x': data does not fit datatype {datatype}")


def test_input_parameters_must_be_an_object() -> None:
    assert refused(one_input(parameters=[1])) == "input 'x' 'parameters' must be a JSON object"


def test_binary_data_size_without_the_header_is_refused() -> None:
    body = one_input(data=None, parameters={"binary_data_size": 24})
    assert refused(body) == f"input 'x' has binary_data_size but the request has no {HEADER_LENGTH} header"


@pytest.mark.parametrize(("size", "needed"), [(20, 24), (28, 24), (0, 24)])
def test_binary_size_not_matching_the_shape_is_refused(size: int, needed: int) -> None:
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": size}}]}
    body, length = binary_request(header, np.zeros(size, dtype=np.uint8))
    assert refused(body, length) == f"input 'x': binary_data_size {size} bytes, shape [2, 3] of FP32 needs {needed}"


@pytest.mark.parametrize("size", [-8, "24", True, 2.4e1])
def test_binary_size_that_is_not_a_non_negative_integer_is_refused(size: object) -> None:
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": size}}]}
    body, length = binary_request(header, np.zeros(6, dtype=np.float32))
    assert refused(body, length) == "input 'x': binary_data_size must be a non-negative integer"


def test_truncated_binary_data_is_refused() -> None:
    x = np.ones((2, 3), dtype=np.float32)
    body, length = binary_request({"inputs": [binary_input("x", "FP32", x)]}, x)
    assert refused(body[:-8], length) == "input 'x': binary data ends after 16 of 24 bytes"


def test_truncated_binary_data_of_a_later_input_names_that_input() -> None:
    a = np.ones(2, dtype=np.int64)
    b = np.ones(4, dtype=np.int64)
    body, length = binary_request({"inputs": [binary_input("a", "INT64", a), binary_input("b", "INT64", b)]}, a, b)
    assert refused(body[:-1], length) == "input 'b': binary data ends after 31 of 32 bytes"


def test_trailing_bytes_after_the_declared_binary_data_are_refused() -> None:
    x = np.ones((2, 3), dtype=np.float32)
    body, length = binary_request({"inputs": [binary_input("x", "FP32", x)]}, x)
    assert refused(body + b"\0\0\0\0", length) == "4 bytes of binary data follow the inputs that declare them"


def test_binary_bytes_after_an_all_json_request_are_refused() -> None:
    body = one_input()
    assert refused(body + b"\x01\x02", len(body)) == "2 bytes of binary data follow the inputs that declare them"


def test_header_length_larger_than_the_body_is_refused() -> None:
    body = one_input()
    message = refused(body, len(body) + 1)
    assert message == f"{HEADER_LENGTH} {len(body) + 1} does not fit a body of {len(body)} bytes"


def test_negative_header_length_is_refused() -> None:
    body = one_input()
    assert refused(body, -1) == f"{HEADER_LENGTH} -1 does not fit a body of {len(body)} bytes"


def test_header_length_that_cuts_the_json_short_is_refused_as_malformed_json() -> None:
    x = np.ones((2, 3), dtype=np.float32)
    body, length = binary_request({"inputs": [binary_input("x", "FP32", x)]}, x)
    assert refused(body, length - 2).startswith("malformed JSON")
