"""The gRPC messages: wire-compatible with Triton's published ones, current with oip.proto, decoded as REST decodes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2, service_pb2

from controlplane.grpcfront import generate
from controlplane.grpcfront import oip_pb2 as pb
from controlplane.grpcfront.tensors import CONTENTS, decode_infer, encode_infer
from serving.codec import OutputRequest, decode_request
from serving.errors import InvalidInput, PayloadTooLarge
from tests.signature_models import ONNX_TYPES, sample_of


def _triton(name: str) -> Descriptor:
    for module in (service_pb2, model_config_pb2):
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise KeyError(name)


def _field_shape(field: FieldDescriptor) -> tuple:
    kind = field.message_type.name if field.message_type else (field.enum_type.name if field.enum_type else "")
    return field.number, field.type, field.is_repeated, kind


def _compare(ours: Descriptor, theirs: Descriptor, path: str) -> list[str]:
    problems = []
    for field in ours.fields:
        other = theirs.fields_by_name.get(field.name)
        if other is None:
            problems.append(f"{path}.{field.name}: not in Triton's message")
        elif _field_shape(field) != _field_shape(other):
            problems.append(f"{path}.{field.name}: {_field_shape(field)} != Triton's {_field_shape(other)}")
        elif field.message_type is not None:
            problems += _compare(field.message_type, other.message_type, f"{path}.{field.name}")
    for enum in ours.enum_types:
        theirs_enum = {v.name: v.number for v in theirs.enum_types_by_name[enum.name].values}
        if {v.name: v.number for v in enum.values} != theirs_enum:
            problems.append(f"{path}.{enum.name}: enum values differ from Triton's")
    return problems


def test_every_message_is_wire_compatible_with_tritons() -> None:
    """Same names, numbers, types and repetition as the messages tritonclient ships, all the way down."""
    problems = []
    for name, message in pb.DESCRIPTOR.message_types_by_name.items():
        problems += _compare(message, _triton(name), name)
    assert problems == []
    ours = pb.DESCRIPTOR.enum_types_by_name["DataType"]
    assert {v.name: v.number for v in ours.values} == {
        v.name: v.number for v in model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"].values
    }
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert methods <= {m.name for m in theirs.methods}


def test_the_checked_in_generated_code_is_current() -> None:
    assert generate.stale() == []


def _typed_request(samples: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    for datatype, sample in samples.items():
        given = request.inputs.add(name=f"in_{datatype}", datatype=datatype, shape=sample.shape)
        values = [v.encode() for v in sample.ravel()] if datatype == "BYTES" else sample.ravel().tolist()
        getattr(given.contents, CONTENTS[datatype][0]).extend(values)
    return request


def test_typed_contents_of_every_datatype_decode_as_rests_json() -> None:
    samples = {d: sample_of(d, batch=3, seed=7) for d in ONNX_TYPES if d in CONTENTS}
    decoded, _ = decode_infer(_typed_request(samples), max_values=1000)
    body = {
        "inputs": [
            {"name": f"in_{d}", "datatype": d, "shape": list(s.shape), "data": s.ravel().tolist()}
            for d, s in samples.items()
        ]
    }
    rest = decode_request(json.dumps(body).encode())
    for datatype, sample in samples.items():
        got = decoded.tensors[f"in_{datatype}"]
        assert got.dtype == rest.tensors[f"in_{datatype}"].dtype == sample.dtype
        np.testing.assert_array_equal(got, sample)


@pytest.mark.parametrize(
    ("datatype", "values", "json_values"),
    [("INT8", [1, 300], [1, 300]), ("UINT16", [70000, 1], [70000, 1]), ("INT16", [-40000, 0], [-40000, 0])],
)
def test_a_value_out_of_range_is_refused_in_rests_words(datatype: str, values: list, json_values: list) -> None:
    request = pb.ModelInferRequest(model_name="m")
    given = request.inputs.add(name="x", datatype=datatype, shape=[2])
    getattr(given.contents, CONTENTS[datatype][0]).extend(values)
    with pytest.raises(InvalidInput) as grpc_refusal:
        decode_infer(request, max_values=1000)
    body = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": json_values}]}
    with pytest.raises(InvalidInput) as rest_refusal:
        decode_request(json.dumps(body).encode())
    assert grpc_refusal.value.message == rest_refusal.value.message
    assert "does not fit datatype" in grpc_refusal.value.message


def test_refusals_of_the_raw_form() -> None:
    two = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 8])
    two.inputs.add(name="a", datatype="FP32", shape=[2])
    two.inputs.add(name="b", datatype="FP32", shape=[2])
    with pytest.raises(InvalidInput, match="raw_input_contents holds 1 entries for 2 inputs"):
        decode_infer(two, max_values=1000)
    mixed = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 8])
    mixed.inputs.add(name="a", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(InvalidInput, match="has contents, but the request sends its inputs in raw_input_contents"):
        decode_infer(mixed, max_values=1000)
    half = pb.ModelInferRequest(model_name="m")
    half.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="FP16 has no typed contents; send it in raw_input_contents"):
        decode_infer(half, max_values=1000)
    strings = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x05\0\0\0abc"])
    strings.inputs.add(name="s", datatype="BYTES", shape=[1])
    with pytest.raises(InvalidInput, match="BYTES element 0 needs 5 bytes, 3 left"):
        decode_infer(strings, max_values=1000)


def test_typed_values_past_the_limit_are_refused_before_conversion() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[11]).contents.fp32_contents.extend([0.0] * 11)
    with pytest.raises(PayloadTooLarge, match="more than 10 values"):
        decode_infer(request, max_values=10)


def test_answers_are_raw_with_bytes_in_tritons_layout_and_scalars_kept() -> None:
    results = {"s": np.array(["ab", "é"], dtype=object), "n": np.array(3.5, dtype=np.float64)}
    wanted = [OutputRequest("s", True), OutputRequest("n", True)]
    response = encode_infer("m", "2", "id-1", results, wanted)
    assert (response.model_name, response.model_version, response.id) == ("m", "2", "id-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("s", "BYTES", [2]), ("n", "FP64", [])]
    assert response.raw_output_contents[0] == b"\x02\0\0\0ab\x02\0\0\0\xc3\xa9"
    assert np.frombuffer(response.raw_output_contents[1], "<f8").tolist() == [3.5]
