"""The Open Inference Protocol's (KServe v2) messages, with Triton's extensions, as models for the document.

The /v2 views parse and write these with `serving.codec` (the hot path: no model validation per
request); these models describe the same JSON for the OpenAPI document, and the tests check real
answers against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.contract import Reply
from controlplane.rollout.states import Slot
from controlplane.schemas import OipError as OipError  # the /v2 error form, with the protocol's messages

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip
Shape = list[int]
Parameters = dict[str, Any]


class _Open(BaseModel):
    # NOTE: the protocol lets clients send extra members (Triton's own ones, say); the server ignores them.
    model_config = ConfigDict(extra="allow")


class ServerMetadata(Reply):
    name: str
    version: str
    extensions: list[str]


class Live(Reply):
    live: bool


class Ready(Reply):
    ready: bool


class ModelReady(Reply):
    name: str
    ready: bool


class TensorMetadata(Reply):
    name: str
    datatype: Datatype
    shape: Shape = Field(description="-1 for a dynamic axis; [] for a scalar")


class ModelMetadata(Reply):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class RequestInput(_Open):
    name: str
    shape: Shape
    datatype: Datatype
    parameters: Parameters | None = Field(None, description="binary_data_size when the data follows the JSON")
    data: list[Any] | None = Field(None, description="the elements in row-major order; absent when binary")


class RequestOutput(_Open):
    name: str
    parameters: Parameters | None = Field(None, description="binary_data: true to get this output as binary")


class InferenceRequest(_Open):
    """An inference request. The binary tensor extension sends this JSON first, then the raw tensors
    (Content-Type application/octet-stream, Inference-Header-Content-Length: the JSON's length)."""

    id: str | None = None
    parameters: Parameters | None = Field(None, description="timeout (ms), route_key (sticky routing)")
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ResponseOutput(Reply):
    name: str
    shape: Shape
    datatype: Datatype
    parameters: Parameters | None = None
    data: list[Any] | None = None


class InferenceResponse(Reply):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class Duration(Reply):
    count: int
    ns: int


class InferenceStats(Reply):
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration = Field(description="decoding the request's inputs")
    compute_infer: Duration
    compute_output: Duration = Field(description="encoding the response's outputs")
    cache_hit: Duration = Field(description="always zero: there is no response cache")
    cache_miss: Duration = Field(description="always zero: there is no response cache")


class BatchStats(Reply):
    batch_size: int
    compute_infer: Duration = Field(description="runs of this size (decode and encode are per request)")


class Padding(Reply):
    real_tokens: int
    padded_tokens: int


class ModelStats(Reply):
    """Triton's statistics of one loaded version, and Flightdeck's own counters after them."""

    name: str
    version: str
    slot: Slot
    provider: str
    last_inference: int = Field(description="ms since the epoch")
    inference_count: int
    execution_count: int
    inference_stats: InferenceStats
    batch_stats: list[BatchStats]
    timeouts: int
    rejected: int
    client_errors: int = Field(description="of fail: requests refused for their own input (400)")
    bisect_runs: int = Field(description="extra runs spent finding the requests that failed a batch")
    lone_runs: int = Field(0, description="of execution_count: runs on the lone-request session, with every core")
    queue_depth: int
    padding: Padding


class ModelStatistics(Reply):
    model_stats: list[ModelStats]


ModelConfig = dict[str, Any]
