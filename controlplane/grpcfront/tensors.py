"""ModelInferRequest to the engine's tensors and back: the gRPC form of `serving.codec`, with its checks and words.

An input's values come either typed, in `contents` (the field its datatype uses, as Triton reads them:
INT8 and INT16 in `int_contents`, UINT8 and UINT16 in `uint_contents`; FP16 and BF16 have none), or raw,
one `raw_input_contents` entry per input (all or none, as Triton requires): little-endian, row-major,
BYTES in Triton's layout. Answers always carry `raw_output_contents`, as Triton's do (tritonclient's
`as_numpy` reads them); gRPC has no JSON, so REST's `binary_data` choice has nothing to choose.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from controlplane.grpcfront import oip_pb2 as pb
from serving.codec import (
    InferRequest,
    OutputRequest,
    check_count,
    check_shape,
    fit_values,
    tensor_bytes,
    tensor_from_bytes,
    utf8_text,
)
from serving.errors import InvalidInput, PayloadTooLarge
from serving.tensors import DATATYPES, datatype_of

# The contents field each datatype's values travel in, and the numpy type that field's values have.
CONTENTS: dict[str, tuple[str, Any]] = {
    "BOOL": ("bool_contents", np.bool_),
    "INT8": ("int_contents", np.int32),
    "INT16": ("int_contents", np.int32),
    "INT32": ("int_contents", np.int32),
    "INT64": ("int64_contents", np.int64),
    "UINT8": ("uint_contents", np.uint32),
    "UINT16": ("uint_contents", np.uint32),
    "UINT32": ("uint_contents", np.uint32),
    "UINT64": ("uint64_contents", np.uint64),
    "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64),
    "BYTES": ("bytes_contents", None),
}
RAW = "raw_input_contents"


def parameter_value(parameter: pb.InferParameter | pb.ModelRepositoryParameter) -> Any:
    """Return a parameter's value as Python holds it (None when none is set)."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def parameters(mapping: Any) -> dict[str, Any]:
    """Return a map<string, InferParameter> as a dict of Python values."""
    return {key: parameter_value(value) for key, value in mapping.items()}


def decode_infer(request: pb.ModelInferRequest, max_values: int) -> tuple[InferRequest, int]:
    """Decode a ModelInferRequest as `codec.decode_request` decodes a body; return it and perf_counter_ns at the start.

    Typed contents hold at most `max_values` values in all (FLIGHTDECK_MAX_REQUEST_VALUES, 413 past it, as JSON):
    each becomes a Python object on the way to numpy; raw contents have no such cost.
    """
    started = time.perf_counter_ns()
    if not request.inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"{RAW} holds {len(raw)} entries for {len(request.inputs)} inputs: give one per input, or none"
        )
    tensors: dict[str, np.ndarray] = {}
    budget = max_values
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name:
            raise InvalidInput("each input needs a string 'name'")
        if name in tensors:
            raise InvalidInput(f"input '{name}' is given twice")
        datatype = tensor.datatype
        if datatype not in DATATYPES:
            raise InvalidInput(
                f"input '{name}': unsupported datatype {datatype!r}; supported: {sorted(DATATYPES)}", "datatype"
            )
        shape = check_shape(list(tensor.shape), name)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{name}' has contents, but the request sends its inputs in {RAW}")
            tensors[name] = tensor_from_bytes(raw[index], name, datatype, shape, size_name=f"{RAW}[{index}] size")
            continue
        budget -= _count(tensor.contents)
        if budget < 0:
            raise PayloadTooLarge(
                f"the request's contents hold more than {max_values} values (FLIGHTDECK_MAX_REQUEST_VALUES); "
                f"send large tensors in {RAW}"
            )
        tensors[name] = _typed(tensor.contents, name, datatype, shape)
    outputs = None
    if request.outputs:
        outputs = []
        for output in request.outputs:
            if not output.name:
                raise InvalidInput("each requested output needs a string 'name'")
            outputs.append(OutputRequest(output.name, binary=True))
    decoded = InferRequest(
        id=request.id or None,
        tensors=tensors,
        outputs=outputs,
        binary_output=True,
        parameters=parameters(request.parameters),
    )
    return decoded, started


def _count(contents: pb.InferTensorContents) -> int:
    return sum(len(getattr(contents, field)) for field, _ in set(CONTENTS.values()))


def _typed(contents: pb.InferTensorContents, name: str, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if datatype not in CONTENTS:
        raise InvalidInput(f"input '{name}': {datatype} has no typed contents; send it in {RAW}", "datatype")
    field, wide = CONTENTS[datatype]
    values = getattr(contents, field)
    check_count(name, len(values), shape)
    if wide is None:
        array = np.empty(len(values), dtype=object)
        array[:] = [utf8_text(value, name, index) for index, value in enumerate(values)]
        return array.reshape(shape)
    return fit_values(np.array(values, dtype=wide), name, DATATYPES[datatype], shape)


def encode_infer(
    name: str, version: str, request_id: str | None, results: dict[str, np.ndarray], wanted: list[OutputRequest]
) -> pb.ModelInferResponse:
    """Encode the outputs asked for as a ModelInferResponse, every one in raw_output_contents."""
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id or "")
    for want in wanted:
        # NOTE: not ascontiguousarray, which turns a scalar into shape [1]; tobytes is row-major anyway.
        array = np.asarray(results[want.name])
        response.outputs.add(name=want.name, datatype=datatype_of(array), shape=array.shape)
        response.raw_output_contents.append(tensor_bytes(array))
    return response
