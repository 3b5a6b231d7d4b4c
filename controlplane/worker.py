"""Flightdeck's gunicorn worker: uvicorn's event loop (uvloop, httptools) serving `controlplane.asgi.Front`.

Why not gthread: on this machine a hello-world WSGI app under gunicorn's gthread worker cost
~160-190 µs of CPU per request (gunicorn parses HTTP in Python and hands each request to a
thread); under this worker, ~46 µs. Inference requests need no thread at all here (they wait
on the loop for the batcher), so the worker's CPU goes to the model (README, "Benchmarks").

What differs from uvicorn's own `UvicornWorker`:
- SIGTERM, SIGINT and SIGQUIT (the master's Ctrl-C) stop the engine admitting at once, then uvicorn stops accepting,
  lets in-flight requests finish within gunicorn's graceful timeout, and the `worker_exit` hook
  drains what the engine still holds.
- A request's head (request line and headers) is at most `MAX_HEAD_BYTES`: uvicorn's httptools
  protocol sets no bound of its own, where gunicorn had one (`BoundedHttpToolsProtocol`).
- Forwarding headers (X-Forwarded-For, -Proto) are trusted only when FORWARDED_ALLOW_IPS names the
  proxies, and then only from them; unset, the audit log's address is the peer's and the scheme is
  the connection's (gunicorn's own default trusted 127.0.0.1, so any local process could set
  the address audit events and the login throttle see). No Server header, no access log (the app writes its own request log), at most gunicorn's
  `worker_connections` connections at once (more get 503).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

# NOTE: nginx allows 4 x 8 KiB of headers, Node 16 KiB; gunicorn 100 fields of 8 KiB each.
MAX_HEAD_BYTES = 64 * 1024
LINGER_S = 2.0
HOOK_TIME_S = 2  # of gunicorn's graceful timeout, kept for the worker_exit hook
_TOO_LARGE = b"request line and headers are over the limit of %d bytes" % MAX_HEAD_BYTES


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 431 to a request whose head grows past MAX_HEAD_BYTES.

    NOTE: httptools gathers a header's name and value before any callback sees them, so the bound is
    counted on the reads that end with the head still incomplete; a head that arrives whole in one
    read (uvloop reads up to 256 KiB) is not counted. What it bounds is memory: a connection holds at
    most MAX_HEAD_BYTES plus one read of head, where uvicorn alone holds whatever a client sends. The connection then discards what still arrives for
    `LINGER_S` and closes: closed at once, the client's next bytes would draw a reset that can
    destroy the 431 before the client reads it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes begin a request's head
        self._heads_done = 0
        self._head_bytes = 0
        self._refused = False

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        in_head, heads_done = self._in_head, self._heads_done
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if in_head and heads_done == self._heads_done:
            self._head_bytes += len(data)  # all of it was head
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refused = True
            # NOTE: HTTP answers in order: a pipelined head refused while an earlier request is still being
            # answered gets its 431 after that answer (on_response_complete), never in its place.
            if self.cycle is None or self.cycle.response_complete:
                self._refuse()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refused and self.cycle.response_complete and not self.transport.is_closing():
            self._refuse()

    def _refuse(self) -> None:
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TOO_LARGE), _TOO_LARGE)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


class DrainingServer(Server):
    """uvicorn's server, telling the app to stop admitting the moment a stop signal arrives."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        begin_drain = getattr(self.config.app, "begin_drain", None)
        if begin_drain is not None:
            begin_drain()
        super().handle_exit(sig, frame)


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
        # NOTE: the heartbeat (a tmpfs write) and the master check every second rather than every timeout/2.
        self.config.timeout_notify = min(self.timeout, 1.0)
        self._server: DrainingServer | None = None
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
        self._server = server = DrainingServer(config=self.config)
        # NOTE: not UvicornWorker's SIGQUIT handler: it only clears gunicorn's `alive`, which uvicorn never
        # reads, so the master's SIGQUIT (how it passes on a Ctrl-C) waited out the grace period and the
        # worker was killed undrained.
        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, server.handle_exit, signal.SIGQUIT, None)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)

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


def _exit_now(sig: int, frame: FrameType | None) -> None:
    sys.exit(0)
