"""The Open Inference Protocol (KServe v2) codec: JSON tensors and the binary-tensor extension.

A request body is JSON, or, when the `Inference-Header-Content-Length` header is given, a JSON
header of that many bytes followed by the raw little-endian bytes of every input that carries a
`binary_data_size` parameter, in the order the inputs are listed. Responses mirror that.

BYTES tensors (ONNX Runtime's strings) are JSON strings, or in binary each element as a 4-byte
little-endian length and then its UTF-8 bytes (Triton's serialization). ONNX Runtime holds text,
so an element that is not UTF-8 is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from serving.errors import InvalidInput
from serving.tensors import DATATYPES, datatype_of

HEADER_LENGTH = "Inference-Header-Content-Length"

# Digits map to "0", every other byte to a space: a run of 20 digits is then one substring search.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))


def _loads(raw: bytes) -> Any:
    """Parse JSON as `json.loads` does, through orjson (3-7x faster) wherever the two agree."""
    # NOTE: orjson reads an integer past 64 bits as a float, where json keeps it exact (the codec
    # refuses or accepts such values by their exact kind), so a body with a 20-digit run goes to
    # json; so does all orjson refuses (NaN, a BOM, lone surrogates, deep nesting), to keep json's answers.
    if b"0" * 20 not in raw.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def _dumps(response: dict[str, Any], finite: bool) -> bytes:
    """Serialise as compact `json.dumps` would, through orjson (about 20x faster) where it can."""
    # NOTE: orjson writes NaN and infinities as null and refuses lone surrogates; json.dumps keeps
    # writing those bodies as it always did. Otherwise they differ only in spelling (1e-5 for 1e-05,
    # raw UTF-8 for \u escapes): the same values to any JSON reader.
    if finite:
        try:
            return orjson.dumps(response)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(response, separators=(",", ":")).encode()


@dataclass
class OutputRequest:
    """An output the client asked for, and whether it wants it as binary data."""

    name: str
    binary: bool


@dataclass
class InferRequest:
    """A decoded inference request."""

    id: str | None
    tensors: dict[str, np.ndarray]
    outputs: list[OutputRequest] | None
    binary_output: bool
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def timeout_us(self) -> int | None:
        """Return the client's `timeout` parameter in microseconds, as Triton reads it."""
        value = self.parameters.get("timeout")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidInput(f"parameter 'timeout' must be a positive integer of microseconds, got {value!r}")
        return value


# numpy's limits: at most 64 dimensions (32 before numpy 2), each an intp.
MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32
MAX_DIM = np.iinfo(np.intp).max


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def check_shape(value: Any, name: str) -> tuple[int, ...]:
    """Return a tensor's shape from a list of integers; raise InvalidInput naming what is wrong."""
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise InvalidInput(f"input '{name}': 'shape' must be a list of integers")
    if len(value) > MAX_DIMS:
        raise InvalidInput(
            f"input '{name}': shape has {len(value)} dimensions; at most {MAX_DIMS} are supported", "shape"
        )
    if any(d < 0 for d in value):
        raise InvalidInput(f"input '{name}': shape {_short(value)} has a negative dimension", "shape")
    if any(d > MAX_DIM for d in value):
        raise InvalidInput(f"input '{name}': shape {_short(value)} has a dimension over {MAX_DIM}", "shape")
    return tuple(value)


def _short(shape: list[int]) -> str:
    """A shape for a message: whole, or its first dimensions when it is long or its numbers huge."""
    text = str(shape)
    return text if len(text) <= 120 else text[:117] + "...]"


# Which kinds of JSON value (as numpy infers them) each target kind accepts: no strings, no
# null, no fractions into integers, no numbers into BOOL; JSON has no other way to say a type.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def _decode_json_strings(data: list, name: str, shape: tuple[int, ...]) -> np.ndarray:
    values: list[str] = []
    stack = [iter(data)]
    while stack:  # NOTE: a loop, not recursion, so deep nesting cannot overflow the stack
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        elif isinstance(item, str):
            values.append(item)
        else:
            raise InvalidInput(
                f"input '{name}': data does not fit datatype BYTES: every element must be a string", "datatype"
            )
    check_count(name, len(values), shape)
    return _object_array(values, shape)


_END = object()


def check_count(name: str, count: int, shape: tuple[int, ...]) -> None:
    """Refuse an input whose number of values is not what its shape needs."""
    expected = math.prod(shape)
    if count != expected:
        raise InvalidInput(f"input '{name}': {count} values given, shape {list(shape)} needs {expected}", "shape")


def fit_values(values: np.ndarray, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Return `values` (integers or numbers of a wider type) as `dtype` in `shape`; refuse an integer out of range."""
    # NOTE: values that a safe cast keeps (int64 JSON into an INT64 input, the usual case) need no range check:
    # its min and max were 4 % of the event loop's time for a 32-token text classifier's two inputs.
    if dtype.kind in "iu" and values.size and not np.can_cast(values.dtype, dtype, "safe"):
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            datatype = datatype_of(np.empty(0, dtype))
            raise InvalidInput(
                f"input '{name}': data does not fit datatype {datatype}: a value is outside [{info.min}, {info.max}]",
                "datatype",
            )
    return values.astype(dtype, copy=False).reshape(shape)


def _object_array(values: list[str], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)


def decode_binary_strings(
    raw: bytes, name: str, shape: tuple[int, ...], size_name: str = "binary_data_size"
) -> np.ndarray:
    """Decode BYTES in Triton's layout (a 4-byte little-endian length, then UTF-8), as many as `shape` holds."""
    values: list[str] = []
    position = 0
    for index in range(math.prod(shape)):
        if position + 4 > len(raw):
            raise InvalidInput(f"input '{name}': BYTES data ends before element {index}'s length")
        size = int.from_bytes(raw[position : position + 4], "little")
        position += 4
        if position + size > len(raw):
            raise InvalidInput(f"input '{name}': BYTES element {index} needs {size} bytes, {len(raw) - position} left")
        values.append(utf8_text(raw[position : position + size], name, index))
        position += size
    if position != len(raw):
        raise InvalidInput(f"input '{name}': {size_name} is {len(raw)} bytes but the elements use {position}")
    return _object_array(values, shape)


def utf8_text(element: bytes, name: str, index: int) -> str:
    """Return a BYTES element as text (ONNX Runtime holds strings); refuse one that is not UTF-8."""
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"input '{name}': BYTES element {index} is not UTF-8 text") from None


def tensor_from_bytes(
    raw: bytes | memoryview, name: str, datatype: str, shape: tuple[int, ...], size_name: str = "binary_data_size"
) -> np.ndarray:
    """Decode one tensor's raw little-endian bytes (BYTES in Triton's layout); `size_name` is what the message calls their size."""
    dtype = DATATYPES[datatype]
    if dtype.kind == "O":
        return decode_binary_strings(bytes(raw), name, shape, size_name)
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"input '{name}': {size_name} {len(raw)} bytes, shape {list(shape)} of {datatype} needs {expected}",
            "shape",
        )
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<"), count=math.prod(shape)).reshape(shape)


def tensor_bytes(array: np.ndarray) -> bytes:
    """Return a tensor's raw bytes: little-endian, row-major; BYTES in Triton's layout."""
    if array.dtype.kind == "O":
        return _encode_binary_strings(array)
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def _encode_binary_strings(array: np.ndarray) -> bytes:
    parts = []
    for value in array.reshape(-1):
        data = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts.append(len(data).to_bytes(4, "little") + data)
    return b"".join(parts)


def _decode_json_data(data: Any, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidInput(f"input '{name}': 'data' must be a list")
    if dtype.kind == "O":
        return _decode_json_strings(data, name, shape)
    datatype = datatype_of(np.empty(0, dtype))
    try:
        inferred = np.array(data)
    except ValueError as exc:  # ragged nesting
        raise InvalidInput(
            f"input '{name}': data does not fit datatype {datatype}: not a regular array ({exc})", "shape"
        ) from None
    check_count(name, inferred.size, shape)
    if dtype == np.uint64 and inferred.dtype.kind in "fO":
        # NOTE: numpy infers float64 for integers past INT64's max; Python's ints are exact, so keep them.
        exact = np.array(data, dtype=object)
        if all(type(v) is int for v in exact.flat):
            if not all(0 <= v < 2**64 for v in exact.flat):
                raise InvalidInput(
                    f"input '{name}': data does not fit datatype UINT64: a value is outside [0, {2**64 - 1}]",
                    "datatype",
                )
            return exact.astype(dtype).reshape(shape)
    if inferred.size and inferred.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise InvalidInput(
            f"input '{name}': data does not fit datatype {datatype}: it holds {_describe(inferred)} values",
            "datatype",
        )
    return fit_values(inferred, name, dtype, shape)


def _describe(array: np.ndarray) -> str:
    return {"b": "boolean", "f": "fractional (or too large)", "U": "string", "O": "null or mixed"}.get(
        array.dtype.kind, str(array.dtype)
    )


def decode_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Decode an inference request body; raise InvalidInput naming what is wrong."""
    if header_length is None:
        header_bytes, binary = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise InvalidInput(f"{HEADER_LENGTH} {header_length} does not fit a body of {len(body)} bytes")
        header_bytes, binary = body[:header_length], body[header_length:]
    try:
        payload = _loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("malformed JSON: nested too deeply") from None
    payload = _object(payload, "request body")
    parameters = payload.get("parameters") or {}
    _object(parameters, "'parameters'")
    raw_inputs = payload.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list")

    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for raw in raw_inputs:
        raw = _object(raw, "each input")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput("each input needs a string 'name'")
        if name in tensors:
            raise InvalidInput(f"input '{name}' is given twice")
        datatype = raw.get("datatype")
        if datatype not in DATATYPES:
            raise InvalidInput(
                f"input '{name}': unsupported datatype {datatype!r}; supported: {sorted(DATATYPES)}", "datatype"
            )
        dtype = DATATYPES[datatype]
        shape = check_shape(raw.get("shape"), name)
        input_params = _object(raw.get("parameters") or {}, f"input '{name}' 'parameters'")
        size = input_params.get("binary_data_size")
        if size is None:
            tensors[name] = _decode_json_data(raw.get("data"), name, dtype, shape)
            continue
        if header_length is None:
            raise InvalidInput(f"input '{name}' has binary_data_size but the request has no {HEADER_LENGTH} header")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
        if offset + size > len(binary):
            raise InvalidInput(f"input '{name}': binary data ends after {len(binary) - offset} of {size} bytes")
        tensors[name] = tensor_from_bytes(memoryview(binary)[offset : offset + size], name, datatype, shape)
        offset += size
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data follow the inputs that declare them")

    binary_output = bool(parameters.get("binary_data_output", False))
    outputs = None
    if payload.get("outputs") is not None:
        if not isinstance(payload["outputs"], list):
            raise InvalidInput("'outputs' must be a list")
        outputs = []
        for raw in payload["outputs"]:
            raw = _object(raw, "each requested output")
            if not isinstance(raw.get("name"), str):
                raise InvalidInput("each requested output needs a string 'name'")
            out_params = _object(raw.get("parameters") or {}, f"output '{raw['name']}' 'parameters'")
            outputs.append(OutputRequest(raw["name"], bool(out_params.get("binary_data", binary_output))))
    request_id = payload.get("id")
    return InferRequest(
        id=None if request_id is None else str(request_id),
        tensors=tensors,
        outputs=outputs,
        binary_output=binary_output,
        parameters=parameters,
    )


def select_outputs(request: InferRequest, available: list[str]) -> list[OutputRequest]:
    """Return the outputs to send, in order; raise InvalidInput for an unknown name."""
    if request.outputs is None:
        return [OutputRequest(name, request.binary_output) for name in available]
    unknown = [o.name for o in request.outputs if o.name not in available]
    if unknown:
        raise InvalidInput(f"unknown output(s) {unknown}; model has {available}", "unknown_output")
    return request.outputs


def encode_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    results: dict[str, np.ndarray],
    wanted: list[OutputRequest],
) -> tuple[bytes, int | None]:
    """Encode outputs; return (body, JSON header length or None when all JSON)."""
    outputs = []
    chunks: list[bytes] = []
    finite = True
    for want in wanted:
        # NOTE: not ascontiguousarray, which turns a scalar into shape [1]; tobytes is row-major anyway.
        array = np.asarray(results[want.name])
        entry: dict[str, Any] = {"name": want.name, "datatype": datatype_of(array), "shape": list(array.shape)}
        if want.binary:
            raw = tensor_bytes(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif array.dtype.kind == "O":
            entry["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.ravel()]
        else:
            if array.dtype.kind in "fc":
                finite = finite and bool(np.isfinite(array).all())
            entry["data"] = array.ravel().tolist()
        outputs.append(entry)
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": outputs}
    if request_id is not None:
        response["id"] = request_id
    header = _dumps(response, finite)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
