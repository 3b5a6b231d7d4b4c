"""grpc.health.v1.Health over this process's readiness: what Kubernetes' gRPC probes call.

"" (the server) and `inference.GRPCInferenceService` are SERVING exactly when REST's
/v2/health/ready answers 200 (`Engine.ready`: converged, every loaded model serving, not draining);
any other service name is NOT_FOUND, as the standard asks. Readiness changes in other threads (the
reconciler), so Watch looks at it every WATCH_INTERVAL_S and writes each change.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.engine import Engine

SERVICES = frozenset({"", "inference.GRPCInferenceService"})
WATCH_INTERVAL_S = 1.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class EngineHealth(health_pb2_grpc.HealthServicer):
    """The health service, read from the engine at each call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._draining = False

    def draining(self) -> None:
        """Answer NOT_SERVING from now on (SIGTERM), whatever the engine says."""
        self._draining = True

    def status(self, service: str) -> int:
        """Return the serving status of `service` now."""
        if service not in SERVICES:
            return SERVICE_UNKNOWN
        return SERVING if not self._draining and self.engine.ready() else NOT_SERVING

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext):  # noqa: N802
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext):  # noqa: N802
        last = None
        while True:
            status = self.status(request.service)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            await asyncio.sleep(WATCH_INTERVAL_S)
