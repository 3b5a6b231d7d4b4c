"""The master's check that the gRPC port is free, before its workers share it: no gRPC or engine imported here."""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.config import Settings


def check_port_free(settings: Settings) -> None:
    """Refuse to start when something already listens on the gRPC port (before the workers bind it with SO_REUSEPORT)."""
    if not settings.grpc_port:
        return
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((settings.host, settings.grpc_port))  # NOTE: no SO_REUSEPORT: any holder of the port refuses it
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SystemExit(
                    f"FLIGHTDECK_GRPC_PORT {settings.grpc_port} on {settings.host} is in use by another process; "
                    "choose another port, or 0 to serve no gRPC"
                ) from None
            raise
