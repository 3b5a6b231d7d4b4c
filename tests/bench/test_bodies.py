"""The benchmark's request bodies decode, through the product's own decoders, to the tensors they were made from."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.measure import binary_request_body, grpc_request, sample_inputs
from controlplane.grpcfront import oip_pb2
from controlplane.grpcfront.tensors import decode_infer
from serving.codec import decode_request
from serving.engine import read_manifest
from serving.tensors import ModelSpec


def test_binary_and_grpc_bodies_carry_the_same_tensors(demo_store: Path) -> None:
    spec = ModelSpec.from_manifest(read_manifest(demo_store / "textcls" / "1"))
    inputs = sample_inputs(spec, 2, 16)
    body, header_length = binary_request_body(inputs, spec)
    rest = decode_request(body, header_length)
    assert rest.binary_output is True
    request = oip_pb2.ModelInferRequest.FromString(grpc_request(inputs, spec, "textcls"))
    assert request.model_name == "textcls"
    decoded, _ = decode_infer(request, max_values=1000)
    for name, array in inputs.items():
        np.testing.assert_array_equal(rest.tensors[name], array)
        np.testing.assert_array_equal(decoded.tensors[name], array)
