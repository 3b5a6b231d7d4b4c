"""`inference.GRPCInferenceService`: the Open Inference Protocol's RPCs, answered as REST answers them.

ModelInfer runs on the worker's event loop through the same `inference.Call` as REST's front
(admission, decoding checks and words, engine, deadline timer, codec statistics, metrics, the request
log line); the client's gRPC deadline becomes the request's (never longer than the model's default).
ServerLive and ServerReady are answered on the loop, open as REST's probes are. Every other RPC is
the REST request it stands for, answered by its Flask view (`bridge`): auth, roles, audit and messages
are REST's own.

Metadata both ways: `x-request-id` (the caller's when sensible, else a new one) comes back in the
trailing metadata of every answer; a ModelInfer's also carries `x-model-version` and `x-model-slot`; `x-route-key` routes
stickily as REST's `X-Route-Key` does; `authorization: Bearer <token>` is the API token. A refusal is
the gRPC status for REST's HTTP status (`STATUS_CODES`) with REST's message; a full queue is
UNAVAILABLE with `retry-after` (seconds) in the trailing metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from controlplane import tracing
from controlplane.auth import tokens
from controlplane.grpcfront import oip_pb2 as pb
from controlplane.grpcfront.bridge import ViewAnswer, ViewBridge, model_path
from controlplane.grpcfront.tensors import decode_infer, encode_infer, parameters
from controlplane.inference import Call, run_on_loop
from controlplane.requestid import request_id_from
from serving.errors import Overloaded, ServingError

if TYPE_CHECKING:
    from controlplane.services import Services

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"  # the wire name tritonclient and KServe's clients call
INFER_SPAN = f"/{SERVICE}/ModelInfer"  # the span's name, as gRPC's semantic conventions name an RPC's
BEARER_REQUIRED = "an API token is required: send 'authorization: Bearer <token>' metadata"

# REST's HTTP status -> the gRPC status a client of the protocol expects for the same refusal.
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(http_status: int) -> grpc.StatusCode:
    """Return the gRPC status for an HTTP status REST would answer."""
    return STATUS_CODES.get(http_status, grpc.StatusCode.INTERNAL)


class Metadata:
    """A call's metadata by lower-case name (a repeated key keeps its last value), its request id and peer."""

    __slots__ = ("values", "request_id", "context")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context
        self.values: dict[str, str] = {
            key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)
        }
        self.request_id = request_id_from(self.values.get("x-request-id"))

    @property
    def peer(self) -> str:
        """The client's address."""
        return _peer_address(self.context.peer() or "")

    def header(self, name: str) -> str | None:
        """Return a metadata value by an HTTP header's name (any case), as `Call` asks for headers."""
        return self.values.get(name.lower())

    def rest_headers(self) -> dict[str, str]:
        """The REST request's headers: its id, and the caller's credentials when given."""
        headers = {"X-Request-ID": self.request_id}
        if "authorization" in self.values:
            headers["Authorization"] = self.values["authorization"]
        return headers


def _peer_address(peer: str) -> str:
    """Return the address of gRPC's peer string ('ipv4:127.0.0.1:5000', 'ipv6:[::1]:5000', 'unix:...')."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return rest or peer


class InferenceService:
    """The RPC handlers; `handler()` registers them under `SERVICE`."""

    def __init__(self, services: Services, bridge: ViewBridge) -> None:
        self.services = services
        self.engine = services.engine
        self.settings = services.settings
        self.bridge = bridge

    def handler(self) -> grpc.GenericRpcHandler:
        """Return the generic handler that serves every RPC of the service."""
        rpcs: dict[str, tuple[Callable[..., Awaitable[Message]], type[Message], type[Message]]] = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
            "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
            "ModelInfer": (self.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
            "ModelConfig": (self.model_config, pb.ModelConfigRequest, pb.ModelConfigResponse),
            "ModelStatistics": (self.model_statistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
            "RepositoryIndex": (self.repository_index, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
            "RepositoryModelLoad": (self.load, pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
            "RepositoryModelUnload": (self.unload, pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
        }
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    method, request_deserializer=request.FromString, response_serializer=response.SerializeToString
                )
                for name, (method, request, response) in rpcs.items()
            },
        )

    # -- on the loop -------------------------------------------------------------------------------

    async def server_live(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Message:
        await _send_request_id(context, Metadata(context))
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Message:
        await _send_request_id(context, Metadata(context))
        return pb.ServerReadyResponse(ready=self.engine.ready())

    async def model_infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Message:
        metadata = Metadata(context)
        if self.settings.inference_auth and not await self._token_valid(metadata):
            await _abort(context, metadata, grpc.StatusCode.UNAUTHENTICATED, BEARER_REQUIRED)
        name = request.model_name
        call = Call(
            self.engine,
            self.settings,
            name,
            request.model_version or None,
            metadata.request_id,
            metadata.header,
            tracing.active(),  # NOTE: the caller's traceparent travels in metadata, read as a REST header is
            span_name=INFER_SPAN,
        )
        try:
            try:
                call.admit()
                routing = call.decode_with(
                    lambda: call.accept(
                        *decode_infer(request, self.settings.max_request_values), deadline_s=context.time_remaining()
                    )
                )
                routed = await run_on_loop(self.engine, name, routing)
                decoded = call.decoded
                assert decoded is not None  # decode_with ran before the engine could answer
                response = call.encode(
                    routed, lambda wanted: encode_infer(name, routed.version, decoded.id, routed.outputs, wanted)
                )
            except ServingError as exc:
                call.refused(exc)
                trailing = [("retry-after", str(exc.retry_after))] if isinstance(exc, Overloaded) else []
                await _abort(context, metadata, status_code(exc.status), exc.message, trailing)
            except Exception:  # as REST's front: logged once, a bare internal error
                log.exception("unhandled error on ModelInfer of %r", name)
                call.record["error"] = "internal server error"
                await _abort(context, metadata, grpc.StatusCode.INTERNAL, "internal server error")
        finally:
            call.log()
        # NOTE: trailing, not initial, metadata: sent with the status in the same batch, where initial metadata
        # costs an operation of its own per call (measured: README, "Benchmarks").
        context.set_trailing_metadata(
            (("x-request-id", metadata.request_id), ("x-model-version", routed.version), ("x-model-slot", routed.slot))
        )
        return response

    async def _token_valid(self, metadata: Metadata) -> bool:
        scheme, _, secret = (metadata.values.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return False
        return await self.bridge.run(self._find_token, secret.strip())

    def _find_token(self, secret: str) -> bool:
        """Say whether `secret` is a live API token (any role, as REST's inference auth asks); note its use."""
        now = datetime.now(UTC)
        with self.services.sessions() as db:
            found = tokens.find_token(db, secret, now)
            if found is not None:
                tokens.touch(db, found[0].id, now)  # NOTE: writes at most once per TOUCH_EVERY
                db.commit()
        return found is not None

    # -- through the REST views ---------------------------------------------------------------------

    async def _view(
        self, context: grpc.aio.ServicerContext, method: str, path: str, body: Any = None
    ) -> tuple[ViewAnswer, Metadata]:
        metadata = Metadata(context)
        answer = await self.bridge.call(method, path, metadata.rest_headers(), metadata.peer, body)
        return answer, metadata

    async def _ok(self, context: grpc.aio.ServicerContext, method: str, path: str, body: Any = None) -> Any:
        """Return the view's JSON answer; abort with its status's code and message when it refused."""
        answer, metadata = await self._view(context, method, path, body)
        if answer.status != 200:
            await _abort(context, metadata, status_code(answer.status), answer.message)
        await _send_request_id(context, metadata)
        return answer.body

    async def model_ready(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Message:
        answer, metadata = await self._view(context, "GET", model_path(request.name, request.version, "/ready"))
        # NOTE: an unknown model or version is not ready rather than an error, as Triton answers over gRPC.
        if answer.status not in (200, 404, 503):
            await _abort(context, metadata, status_code(answer.status), answer.message)
        await _send_request_id(context, metadata)
        return pb.ModelReadyResponse(ready=answer.status == 200)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> Message:
        return _parse(await self._ok(context, "GET", "/v2"), pb.ServerMetadataResponse)

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Message:
        body = await self._ok(context, "GET", model_path(request.name, request.version))
        return _parse(body, pb.ModelMetadataResponse)

    async def model_config(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> Message:
        body = await self._ok(context, "GET", model_path(request.name, request.version, "/config"))
        return pb.ModelConfigResponse(config=_parse(body, pb.ModelConfig))

    async def model_statistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext) -> Message:
        path = model_path(request.name, request.version, "/stats") if request.name else "/v2/models/stats"
        return _parse(await self._ok(context, "GET", path), pb.ModelStatisticsResponse)

    async def repository_index(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext) -> Message:
        body = await self._ok(context, "POST", "/v2/repository/index", {"ready": request.ready})
        return _parse({"models": body}, pb.RepositoryIndexResponse)

    async def load(self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext) -> Message:
        path = f"/v2/repository/models/{quote(request.model_name, safe='')}/load"
        await self._ok(context, "POST", path, _repository_body(request))
        return pb.RepositoryModelLoadResponse()

    async def unload(self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext) -> Message:
        path = f"/v2/repository/models/{quote(request.model_name, safe='')}/unload"
        await self._ok(context, "POST", path, _repository_body(request))
        return pb.RepositoryModelUnloadResponse()


def _repository_body(request: pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest) -> dict[str, Any]:
    """The REST body of a load or unload: its parameters (a file's bytes stand as a marker, to be refused as REST refuses it)."""
    values = {key: "<bytes>" if isinstance(v, bytes) else v for key, v in parameters(request.parameters).items()}
    return {"parameters": values} if values else {}


def _parse(body: Any, message: type[Message]) -> Message:
    """Build a response message from the view's JSON; fields the protocol's message lacks are left out."""
    return json_format.ParseDict(body, message(), ignore_unknown_fields=True)


async def _send_request_id(context: grpc.aio.ServicerContext, metadata: Metadata) -> None:
    context.set_trailing_metadata((("x-request-id", metadata.request_id),))


async def _abort(
    context: grpc.aio.ServicerContext,
    metadata: Metadata,
    code: grpc.StatusCode,
    message: str,
    trailing: list[tuple[str, str]] | None = None,
) -> None:
    """End the call with `code` and REST's message; the request id (and retry-after) in the trailing metadata."""
    await context.abort(code, message, trailing_metadata=(("x-request-id", metadata.request_id), *(trailing or ())))
