"""The Open Inference Protocol over gRPC, beside HTTP in every serving process (FLIGHTDECK_GRPC_PORT).

Each gunicorn worker runs a `grpc.aio` server on its own event loop (uvloop, the one uvicorn serves
HTTP on), bound to FLIGHTDECK_HOST:FLIGHTDECK_GRPC_PORT with SO_REUSEPORT, so the kernel spreads new
connections over the workers as gunicorn's shared socket spreads HTTP ones. ModelInfer then waits for
the batcher on the loop exactly as REST's front does: no thread per call (README, "Benchmarks", has
the measurements behind this design against a thread-pool server).

Served: `inference.GRPCInferenceService` (`service.py`) and the standard health service
`grpc.health.v1.Health` (`health.py`: SERVING while this process is ready, for "" and the inference
service, so Kubernetes' gRPC probes work). The master checks at start that nothing else holds the
port (`port.check_port_free`): SO_REUSEPORT would otherwise share it silently with another server of the
same user.

Limits, in the spirit of the HTTP front's (`controlplane.httpprotocol`):
- a request message of at most FLIGHTDECK_MAX_REQUEST_BYTES (RESOURCE_EXHAUSTED past it, from gRPC
  itself), and FLIGHTDECK_MAX_REQUEST_VALUES typed values; metadata of at most 64 KiB (as an HTTP head);
- FLIGHTDECK_GRPC_MAX_STREAMS concurrent calls per connection, and gunicorn's worker_connections calls
  per worker in all (RESOURCE_EXHAUSTED past it), as uvicorn's limit_concurrency bounds HTTP;
- keep-alive: the server pings a quiet connection every KEEPALIVE_TIME_S and drops it when no answer comes
  within KEEPALIVE_TIMEOUT_S (a vanished client frees its streams); a client pinging more often than every
  MIN_CLIENT_PING_S is sent GOAWAY; a connection idle for IDLE_S is closed, and any connection is ended
  gracefully after MAX_AGE_S (calls in flight get FLIGHTDECK_DRAIN_GRACE_S), so long-lived channels
  rebalance over the workers and nothing holds a connection for ever.
SIGTERM (`GrpcFront.begin_drain`): new calls are refused at once (the engine stops admitting too), calls in
flight finish within the grace period, then the worker exits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2_grpc

from controlplane.grpcfront.bridge import ViewBridge
from controlplane.grpcfront.health import EngineHealth
from controlplane.grpcfront.service import InferenceService

if TYPE_CHECKING:
    from flask import Flask

    from controlplane.config import Settings
    from controlplane.services import Services

log = logging.getLogger(__name__)

MAX_METADATA_BYTES = 64 * 1024  # as the HTTP front's head (httpprotocol.MAX_HEAD_BYTES)
KEEPALIVE_TIME_S = 60
KEEPALIVE_TIMEOUT_S = 20
MIN_CLIENT_PING_S = 10
IDLE_S = 300
MAX_AGE_S = 1800


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """Return the gRPC server's channel arguments (see the module's docstring for why each)."""
    return [
        ("grpc.so_reuseport", 1),
        ("grpc.max_receive_message_length", settings.max_request_bytes),
        ("grpc.max_send_message_length", -1),  # an answer's size is the model's, for a request already bounded
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.max_concurrent_streams", settings.grpc_max_streams),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_S * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_S * 1000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", IDLE_S * 1000),
        ("grpc.max_connection_age_ms", MAX_AGE_S * 1000),
        ("grpc.max_connection_age_grace_ms", int(settings.drain_grace_s * 1000)),
    ]


class GrpcFront:
    """One worker's gRPC server: started on its loop, drained on SIGTERM."""

    def __init__(self, services: Services, app: Flask, max_calls: int) -> None:
        settings = services.settings
        self.settings = settings
        self.bridge = ViewBridge(app, settings.http_threads)
        self.health = EngineHealth(services.engine)
        self.server = grpc.aio.server(options=server_options(settings), maximum_concurrent_rpcs=max_calls)
        self.server.add_generic_rpc_handlers((InferenceService(services, self.bridge).handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._stopping: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Bind FLIGHTDECK_HOST:FLIGHTDECK_GRPC_PORT (shared with this master's other workers) and serve."""
        address = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        target = f"{address}:{self.settings.grpc_port}"
        try:
            bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:  # grpcio raises when the bind fails
            raise RuntimeError(f"cannot serve gRPC on {target}: {exc}") from None
        if not bound:
            raise RuntimeError(f"cannot serve gRPC on {target}")
        await self.server.start()
        self._loop = asyncio.get_running_loop()

    def request_drain(self, grace_s: float) -> None:
        """Begin draining from a signal handler or another thread: on the loop, as soon as it runs."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.begin_drain, grace_s)

    def begin_drain(self, grace_s: float) -> None:
        """Refuse new calls from now on and let those in flight finish within `grace_s` (on the loop's thread)."""
        if self._stopping is None:
            self.health.draining()
            self._stopping = asyncio.get_running_loop().create_task(self.server.stop(grace_s))

    async def stopped(self, grace_s: float) -> None:
        """Wait until the server has stopped (draining first, if SIGTERM did not begin it)."""
        self.begin_drain(grace_s)
        assert self._stopping is not None
        await self._stopping
        self.bridge.close()
