"""Flightdeck's gunicorn worker: uvicorn's event loop (uvloop, httptools) serving `controlplane.asgi.Front`.

Why not gthread: on this machine a hello-world WSGI app under gunicorn's gthread worker cost
~160-190 µs of CPU per request (gunicorn parses HTTP in Python and hands each request to a
thread); under this worker, ~46 µs. Inference requests need no thread at all here (they wait
on the loop for the batcher), so the worker's CPU goes to the model (docs/benchmarks.md).

What differs from uvicorn's own `UvicornWorker`:
- SIGTERM, SIGINT and SIGQUIT (the master's Ctrl-C) stop the engine admitting at once, then uvicorn stops accepting,
  lets in-flight requests finish within gunicorn's graceful timeout, and the `worker_exit` hook
  drains what the engine still holds.
- Each connection is bounded in size and time (`controlplane.httpprotocol.BoundedHttpToolsProtocol`):
  a head of at most `MAX_HEAD_BYTES`, header, body and keep-alive deadlines from FLIGHTDECK_HEADER_TIMEOUT_S,
  BODY_TIMEOUT_S, BODY_MIN_RATE and KEEPALIVE_TIMEOUT_S, each closing counted in
  `flightdeck_connections_closed_total`; past `worker_connections`, idle connections are closed first.
- Keep-alive connections are spread over the workers (`controlplane.balance`): one holding two more than another
  asks a client to reconnect, as gunicorn's own workers left new connections to idle ones.
- The loop's lag is measured (`controlplane.looplag`) and exported as `flightdeck_event_loop_lag_seconds`.
- Forwarding headers (X-Forwarded-For, -Proto) are trusted only when FORWARDED_ALLOW_IPS names the
  proxies, and then only from them; unset, the audit log's address is the peer's and the scheme is
  the connection's (gunicorn's own default trusted 127.0.0.1, so any local process could set
  the address audit events and the login throttle see). No Server header, no access log (the app writes its own request log).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from controlplane.balance import ConnectionShare, connections_folder
from controlplane.httpprotocol import BoundedHttpToolsProtocol, ConnectionLimits
from controlplane.looplag import watch_loop_lag

if TYPE_CHECKING:
    from controlplane.config import Settings
    from controlplane.grpcfront.server import GrpcFront
    from controlplane.services import Services

HOOK_TIME_S = 2  # of gunicorn's graceful timeout, kept for the worker_exit hook
TICK_S = 1.0  # DrainingServer's tick: uvicorn's is 0.1 s


class DrainingServer(Server):
    """uvicorn's server, telling the app (and the gRPC server) to stop admitting the moment a stop signal arrives.

    Its tick (the heartbeat to the master, the Date header, the look at `should_exit`) comes every `TICK_S`
    rather than uvicorn's 0.1 s, and `handle_exit` wakes it at once: an idle worker's loop then wakes about
    once a second (looplag ticks slower when idle too), where it cost a third of a percent of a core.
    """

    grpc_front: GrpcFront | None = None
    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        begin_drain = getattr(self.config.app, "begin_drain", None)
        if begin_drain is not None:
            begin_drain()
        if self.grpc_front is not None:
            self.grpc_front.request_drain(self.config.timeout_graceful_shutdown or 0)
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            # NOTE: threadsafe: a signal handler may run in the middle of the loop's own work.
            self._loop.call_soon_threadsafe(self._wake.set)

    async def main_loop(self) -> None:
        # As uvicorn's Server.main_loop, every TICK_S; on_tick does its once-a-second work when counter % 10 == 0.
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            except TimeoutError:
                pass
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        # NOTE: here, not after serve(): uvicorn raises the stop signal again once serve() ends, and our
        # handler exits then. gRPC's calls in flight had the same grace as HTTP's, from the same signal.
        if self.grpc_front is not None:
            await self.grpc_front.stopped(self.config.timeout_graceful_shutdown or 0)


class FlightdeckWorker(UvicornWorker):
    CONFIG_KWARGS: dict[str, Any] = {
        "loop": "uvloop",
        "http": BoundedHttpToolsProtocol,
        "lifespan": "off",
        "server_header": False,
        "access_log": False,
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # NOTE: before UvicornWorker builds its Config from CONFIG_KWARGS (and cfg.forwarded_allow_ips).
        self.CONFIG_KWARGS = {**self.CONFIG_KWARGS, "proxy_headers": bool(os.environ.get("FORWARDED_ALLOW_IPS"))}
        super().__init__(*args, **kwargs)
        self.config.limit_concurrency = self.cfg.worker_connections
        # NOTE: the master kills a worker at graceful_timeout; stop waiting for requests a little earlier, so
        # the worker_exit hook still hands the scheduler lease on and writes the last history row.
        self.config.timeout_graceful_shutdown = max(1, self.cfg.graceful_timeout - HOOK_TIME_S)
        # NOTE: the heartbeat (a tmpfs write) and the master check every tick (a second) rather than every timeout/2.
        self.config.timeout_notify = min(self.timeout, TICK_S / 2)
        self._server: DrainingServer | None = None
        self._lag_watch: asyncio.Task[None] | None = None
        # NOTE: uvicorn's per-worker start and stop lines repeat what the hooks in gunicorn.conf.py say.
        logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, self.log.error_log.level))

    def init_signals(self) -> None:
        super().init_signals()
        # NOTE: uvicorn handles these while it serves, then raises the signal again with this handler in place.
        # Left at SIG_DFL (as UvicornWorker leaves them) that kills the process before gunicorn's `worker_exit`
        # hook drains the engine; an exit, here or while the app loads, runs the hook.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, _exit_now)

    async def _serve(self) -> None:
        # As UvicornWorker._serve, with the draining server.
        self.config.app = self.wsgi
        services = getattr(self.wsgi, "services", None)
        grpc_front = None
        if services is not None:
            self._limit_connections(services.settings)
            grpc_front = await self._start_grpc(services)
        self._server = server = DrainingServer(config=self.config)
        server.grpc_front = grpc_front
        if services is not None:
            engine = services.engine

            def busy() -> bool:
                # NOTE: read on the lag timer's tick, not per request; the engine's work covers gRPC calls too.
                return bool(server.server_state.connections) or any(v.batcher.busy for v in engine.loaded())

            self._lag_watch = asyncio.get_running_loop().create_task(watch_loop_lag(_record_lag(), busy))
        # NOTE: not UvicornWorker's SIGQUIT handler: it only clears gunicorn's `alive`, which uvicorn never
        # reads, so the master's SIGQUIT (how it passes on a Ctrl-C) waited out the grace period and the
        # worker was killed undrained.
        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, server.handle_exit, signal.SIGQUIT, None)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)

    async def _start_grpc(self, services: Services) -> GrpcFront | None:
        """Serve the inference protocol over gRPC on this loop too (FLIGHTDECK_GRPC_PORT; 0: not at all)."""
        if not services.settings.grpc_port:
            return None
        from controlplane.grpcfront.server import GrpcFront  # NOTE: here, in the worker: the master never serves gRPC

        front = GrpcFront(services, self.wsgi.flask_app, max_calls=self.cfg.worker_connections)
        await front.start()
        return front

    def _limit_connections(self, settings: Settings) -> None:
        """Give each connection the deadlines of FLIGHTDECK_*_TIMEOUT_S, counted in /metrics as they close one."""
        from controlplane import metrics  # NOTE: here, in the worker: the master never creates metric files

        limits = ConnectionLimits(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            body_min_rate=settings.body_min_rate,
            send_timeout_s=settings.send_timeout_s,
            keepalive_timeout_s=settings.keepalive_timeout_s,
            on_close=metrics.connection_closed,
            share=ConnectionShare(connections_folder(settings)) if self.cfg.workers > 1 else None,
        )
        # NOTE: uvicorn builds each connection's protocol as http(config=..., server_state=..., app_state=...).
        self.config.http = functools.partial(BoundedHttpToolsProtocol, limits=limits)  # type: ignore[assignment]
        self.config.timeout_keep_alive = settings.keepalive_timeout_s  # type: ignore[assignment]

    async def callback_notify(self) -> None:
        """Heartbeat to the master; and stop, draining, when the master is gone (killed: nobody supervises us).

        NOTE: gunicorn's own workers check this on every loop turn; UvicornWorker never does, so a worker
        whose master was SIGKILLed served on, unsupervised, until killed by hand.
        """
        server = self._server
        if self.ppid != os.getppid() and server is not None and not server.should_exit:
            self.log.warning("worker %s: the master (pid %s) is gone; stopping", self.pid, self.ppid)
            server.handle_exit(signal.SIGTERM, None)
        self.notify()


def _record_lag():
    from controlplane import metrics  # NOTE: in the worker only, as in _limit_connections

    return metrics.LoopLag().record


def _exit_now(sig: int, frame: FrameType | None) -> None:
    sys.exit(0)
