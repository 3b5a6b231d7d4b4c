"""The worker's HTTP protocol: uvicorn's httptools protocol with the bounds a connection gets from nginx and gunicorn.

uvicorn's own protocol times out only an idle keep-alive connection: a connection that sends nothing,
drips its head, or stops in the middle of a body is kept for as long as the client likes, with its
buffer (up to the body limit) and, for a Flask route, the thread reading it. Here:

- head size: a request line and headers growing past `MAX_HEAD_BYTES` get 431 (gunicorn's bound);
- header deadline: a head must arrive whole within `header_timeout_s` of its first byte, and a new
  connection's first head within that of the connection's opening (nginx's `client_header_timeout`);
  408 when some of it came, a plain close when nothing did;
- body deadline: while the server reads a body, the next bytes must come within `body_timeout_s`
  (nginx's `client_body_timeout`), and the body must average `body_min_rate` bytes a second after its
  first `body_timeout_s` (Apache's mod_reqtimeout `MinRate`). Time the server itself stopped reading
  (the app has not taken the 64 KiB uvicorn buffers) is not counted against the client. On expiry the
  app's `receive()` answers `http.disconnect` (so a Flask thread reading the body is freed), anything
  the app sends is dropped, and the client gets 408 unless an answer had begun;
- send deadline: while the server waits for the client to read its answer (the transport's buffer is over its
  high-water mark, so the app's `send()` waits), the buffer must shrink within `send_timeout_s` (nginx's
  `send_timeout`, counted between two reads of the client); else the connection is aborted, dropping what
  is buffered and freeing the app (and the Flask thread streaming a file) from its `send()`;
- `Expect: 100-continue`: the body deadline starts when the `100 Continue` goes out (the app's first
  `receive()`), not at the head: a client that waits for it is not late while the request waits for a thread;
- keep-alive: an idle connection closes after `keepalive_timeout_s` (uvicorn's own timer, armed here too when
  the rest of a body answered early arrives after its answer);
- room: past the connection limit (gunicorn's `worker_connections`), the connections that have no
  request in progress (idle keep-alive, silent, or still sending a head) are closed, longest quiet
  first, so a new client and the probes get an answer rather than uvicorn's 503;
- balance: a worker holding two connections more than another answers a request with `Connection: close`
  (controlplane.balance), so the client reconnects to a less loaded worker.

Every closing for these reasons is told to `ConnectionLimits.on_close` (the worker counts them in
`flightdeck_connections_closed_total`). The 408 and 431 answers leave the connection open for `LINGER_S`,
discarding what arrives, before closing it: closed at once, the client's next bytes would draw a reset
that can destroy the answer before the client reads it. So does the app's answer that closes the connection
while the request's body is still coming (a 413 for a body over the limit): the client still sending gets
its answer, not a reset on its send.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from controlplane.balance import ConnectionShare

# The Open Inference Protocol's inference route: (model, version or None).
INFER_PATH = re.compile(r"/v2/models/([^/]+)/(?:versions/([^/]+)/)?infer")

# NOTE: nginx allows 4 x 8 KiB of headers, Node 16 KiB; gunicorn 100 fields of 8 KiB each.
MAX_HEAD_BYTES = 64 * 1024
LINGER_S = 2.0
TIMED_OUT = "flightdeck.timed_out"  # scope["extensions"] key: which deadline ended the request ("body")
# Why a connection was closed, as on_close is told (the metric's `reason` label).
HEADER_TIMEOUT, BODY_TIMEOUT, SEND_TIMEOUT, KEEPALIVE_TIMEOUT, EVICTED, REBALANCED = (
    "header_timeout",
    "body_timeout",
    "send_timeout",
    "keepalive_timeout",
    "evicted",
    "rebalanced",
)
REASONS = (HEADER_TIMEOUT, BODY_TIMEOUT, SEND_TIMEOUT, KEEPALIVE_TIMEOUT, EVICTED, REBALANCED)
EVICT_AT_ONCE = 32  # idle connections closed per eviction at most beyond what is needed (nginx drains 32)
EVICT_QUIET_S = 1.0  # ... if they have been quiet this long
_TOO_LARGE = b"request line and headers are over the limit of %d bytes" % MAX_HEAD_BYTES


def _ignore(reason: str) -> None:
    pass


@dataclass(frozen=True)
class ConnectionLimits:
    """A connection's deadlines (seconds; see the module's docstring) and who hears of each closing."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 65536  # bytes a second; 0 for the inactivity bound alone
    send_timeout_s: float = 30.0
    keepalive_timeout_s: float = 5.0
    on_close: Callable[[str], None] = _ignore  # told one of REASONS
    # The node's connection counts (controlplane.balance); None: this worker does not balance.
    share: ConnectionShare | None = None


class _ReadFlow(FlowControl):
    """uvicorn's flow control, telling the protocol when it stops and resumes reading (not the client's time)."""

    def __init__(self, transport: asyncio.Transport, protocol: BoundedHttpToolsProtocol) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def pause_reading(self) -> None:
        if not self.read_paused:
            super().pause_reading()
            self._protocol._reading_paused()

    def resume_reading(self) -> None:
        if self.read_paused:
            super().resume_reading()
            self._protocol._reading_resumed()
        elif self._protocol._awaiting_continue:
            self._protocol._continue_sent()  # NOTE: uvicorn's receive() calls this right after writing the 100


class _ClosingAfterAnswer:
    """The transport as a request's cycle sees it: `close()` goes through the protocol (`_close_answered`)."""

    def __init__(self, transport: asyncio.Transport, protocol: BoundedHttpToolsProtocol, cycle: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._cycle = cycle
        self.write, self.is_closing = transport.write, transport.is_closing  # NOTE: the hot path, not __getattr__

    def close(self) -> None:
        self._protocol._close_answered(self._cycle)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head, header and body deadlines, and room made past the limit.

    NOTE: httptools gathers a header's name and value before any callback sees them, so the size bound is
    counted on the reads that end with the head still incomplete; a head that arrives whole in one read
    (uvloop reads up to 256 KiB) is not counted. What it bounds is memory: a connection holds at most
    MAX_HEAD_BYTES plus one read of head, where uvicorn alone holds whatever a client sends.

    NOTE: the deadline timer is lazy: while bytes keep arriving it is left where it is and, when it fires
    early, moved to the deadline as it now stands; a request that arrives in one read (the usual
    inference request) arms no timer at all.
    """

    def __init__(self, *args: Any, limits: ConnectionLimits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits or ConnectionLimits()
        self.timeout_keep_alive = self.limits.keepalive_timeout_s
        self._in_head = True  # the next bytes belong to a request's head
        self._heads_done = 0
        self._head_bytes = 0
        self._refused = False
        self._lingering = False  # answered and closing with the request's body unread: what arrives is dropped
        self._head_since: float | None = None  # when the head being read began; None: no head being read
        self._head_started = False  # some byte of that head has come
        self._body_since = 0.0  # when the body being read began, moved on by the time reading was paused
        self._body_bytes = 0
        self._last_read = 0.0  # last bytes, or the end of a pause in reading
        self._paused_at = 0.0
        self._quiet_since = 0.0  # last progress of any kind: eviction closes the longest quiet first
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting_continue = False  # the head asked for 100 Continue and the app has not asked for the body
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_buffered = 0  # the transport's buffer when the send deadline was last set
        self._cycles: list[Any] = []  # this connection's requests not yet answered in full (pipelined ones too)
        self._moving = False  # told to reconnect elsewhere (controlplane.balance): closes after this answer

    # -- connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _ReadFlow(transport, self)
        now = self.loop.time()
        self._head_since = self._quiet_since = now  # NOTE: the first head is timed from the connection's opening
        self._make_room()
        self._arm()
        if self.limits.share is not None:
            self.limits.share.publish(len(self.connections))

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._send_timer = None
        # NOTE: uvicorn tells only the newest request (`self.cycle`) that the client left. With requests
        # pipelined behind it, the one being answered went on writing to the closed transport, which raised
        # in a2wsgi's sender and left the Flask thread streaming the answer blocked for ever.
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._cycles = []
        super().connection_lost(exc)
        if self.limits.share is not None:
            if self._moving:
                self.limits.share.left()
            self.limits.share.publish(len(self.connections))

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_buffered = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_expired)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def data_received(self, data: bytes) -> None:
        if self._refused or self._lingering:
            return
        self._last_read = self._quiet_since = self.loop.time()
        in_head, heads_done = self._in_head, self._heads_done
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._in_head and in_head and heads_done == self._heads_done:
            self._head_bytes += len(data)  # all of it was head
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
            self._refused = True
            # NOTE: HTTP answers in order: a pipelined head refused while an earlier request is still being
            # answered gets its 431 after that answer (on_response_complete), never in its place.
            if self.cycle is None or self.cycle.response_complete:
                self._refuse(b"431 Request Header Fields Too Large", _TOO_LARGE)
            return
        self._arm()
        if self._idle() and self.timeout_keep_alive_task is None:
            # NOTE: uvicorn cancels its keep-alive timer on any bytes and arms it only when an answer completes.
            # The rest of a body answered early (a 401 before it was read) completes no answer and begins no
            # head: without this the connection stayed open, with no deadline, for ever.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _idle(self) -> bool:
        """Between requests: every request answered, no byte of the next head come."""
        return self._in_head and self._head_since is None and (self.cycle is None or self.cycle.response_complete)

    # -- parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_since is None:
            self._head_since = self.loop.time()
        self._head_started = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        self._head_since, self._head_started = None, False
        self._body_since = self._last_read = self.loop.time()
        self._body_bytes = 0
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = _ClosingAfterAnswer(self.transport, self, self.cycle)  # type: ignore[assignment]
        self._cycles = [c for c in self._cycles if not c.response_complete]
        self._cycles.append(self.cycle)
        self._awaiting_continue = self.cycle is not None and self.cycle.waiting_for_100_continue
        share = self.limits.share
        # NOTE: only at an inference request, the load worth spreading: a client's control calls keep the worker they
        # talk to (tritonclient's load_model returns once that worker serves the model; is_model_ready asks it next).
        # Never behind pipelined requests: they would be closed on unanswered.
        if (
            share is not None
            and self.cycle is not None
            and self.cycle.keep_alive
            and len(self._cycles) == 1
            and self.scope["method"] == "POST"
            and INFER_PATH.fullmatch(self.scope["path"]) is not None
        ):
            if share.should_move(len(self.connections)):  # answered whole, then closed: the client reconnects
                self._moving = True
                self.cycle.keep_alive = False
                self.limits.on_close(REBALANCED)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._lingering:
            self._unset_keepalive_if_required()
            return
        self._quiet_since = self.loop.time()
        if self._awaiting_continue:  # answered without asking for the body: the client may still send it, or not
            self._awaiting_continue = False
            self._body_since = self._last_read = self._quiet_since
        if self.transport.is_closing() or not self.cycle.response_complete:
            return
        if self._refused:
            self._refuse(b"431 Request Header Fields Too Large", _TOO_LARGE)
            return
        if self._head_since is not None:  # the next head has begun: its own deadline, not the keep-alive's
            self._unset_keepalive_if_required()
        self._arm()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.limits.on_close(KEEPALIVE_TIMEOUT)
        super().timeout_keep_alive_handler()

    # -- deadlines

    def _due(self) -> tuple[float, str] | None:
        """Return (when, which) of the deadline that applies now, or None while none does."""
        cycle = self.cycle
        if self._in_head:
            if self._head_since is None or (cycle is not None and not cycle.response_complete):
                return None  # idle keep-alive (uvicorn's timer), or the request is being answered
            return self._head_since + self.limits.header_timeout_s, HEADER_TIMEOUT
        if self._awaiting_continue or self.flow.read_paused:
            return None  # NOTE: we stopped reading (the app has not taken what is buffered): not the client's delay
        limits = self.limits
        due = self._last_read + limits.body_timeout_s
        if limits.body_min_rate:
            due = min(due, self._body_since + limits.body_timeout_s + self._body_bytes / limits.body_min_rate)
        return due, BODY_TIMEOUT

    def _arm(self) -> None:
        due = self._due()
        timer = self._timer
        if due is None:
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        if timer is not None:
            if timer.when() <= due[0]:
                return  # fires early and moves itself on (_expire)
            timer.cancel()
        self._timer = self.loop.call_at(due[0], self._expire)

    def _expire(self) -> None:
        self._timer = None
        due = self._due()
        if due is None or self._refused or self.transport.is_closing():
            return
        when, which = due
        if self.loop.time() < when:
            self._timer = self.loop.call_at(when, self._expire)
            return
        self.limits.on_close(which)
        if which == HEADER_TIMEOUT:
            if not self._head_started:  # nothing came: nothing to answer
                self.transport.close()
                return
            message = b"the request line and headers did not arrive within %g s" % self.limits.header_timeout_s
            self._refuse(b"408 Request Timeout", message)
            return
        cycle = self.cycle
        # NOTE: the app sees the client gone (receive() says http.disconnect, so a Flask thread reading the
        # body gets a short read and finishes) and what it sends from now on is dropped.
        answered = cycle.response_started
        cycle.disconnected = True
        cycle.scope.setdefault("extensions", {})[TIMED_OUT] = "body"  # type: ignore[typeddict-item]
        cycle.message_event.set()
        if answered:
            self.transport.close()
            return
        message = b"the request body stopped arriving (%d of it in %.1f s)" % (
            self._body_bytes,
            self.loop.time() - self._body_since,
        )
        self._refuse(b"408 Request Timeout", message)

    def _continue_sent(self) -> None:
        """The app asked for the body and uvicorn wrote `100 Continue`: the body's clock starts now."""
        cycle = self.cycle
        if cycle is not None and not cycle.waiting_for_100_continue:
            self._awaiting_continue = False
            self._body_since = self._last_read = self.loop.time()
            self._arm()

    def _send_expired(self) -> None:
        """The client has not read for `send_timeout_s`: abort, unless the buffer shrank meanwhile (then wait on)."""
        self._send_timer = None
        if self.transport.is_closing() and not self.flow.write_paused:
            return
        buffered = self.transport.get_write_buffer_size()
        if buffered < self._send_buffered:
            self._send_buffered = buffered
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_expired)
            return
        self.limits.on_close(SEND_TIMEOUT)
        # NOTE: abort, not close: close() would wait, holding the buffer, for a client that does not read.
        self.transport.abort()

    def _reading_paused(self) -> None:
        self._paused_at = self.loop.time()
        self._arm()

    def _reading_resumed(self) -> None:
        now = self.loop.time()
        self._body_since += now - self._paused_at
        self._last_read = now
        self._arm()

    # -- room past the limit

    def _idle(self) -> bool:
        """Whether no request is in progress here: idle keep-alive, silent, or still sending its head."""
        cycle = self.cycle
        return (cycle is None or cycle.response_complete or cycle.disconnected) and not self.pipeline

    def _make_room(self) -> None:
        """Past the connection limit, close the connections longest quiet that have no request in progress.

        NOTE: uvicorn answers 503 once `len(connections) >= limit_concurrency`, counting this one.
        """
        limit = self.limit_concurrency
        if limit is None or len(self.connections) < limit:
            return
        excess = len(self.connections) - limit + 1
        idle = [c for c in self.connections if c is not self and isinstance(c, BoundedHttpToolsProtocol) and c._idle()]
        idle.sort(key=lambda c: c._quiet_since)
        # NOTE: a few more than needed, so a flood does not scan every connection for each newcomer; but only
        # ones quiet for a while, never a client that connected a moment ago and is sending its request.
        quiet_before = self.loop.time() - EVICT_QUIET_S
        extra = sum(1 for c in idle[excess : excess + EVICT_AT_ONCE] if c._quiet_since < quiet_before)
        for connection in idle[: excess + extra]:
            self.limits.on_close(EVICTED)
            connection._refused = True
            connection.transport.close()
            # NOTE: out of the count now, not when connection_lost runs: the newcomer's head may be parsed first.
            self.connections.discard(connection)

    # -- answers of our own

    def _close_answered(self, cycle: Any) -> None:
        """The app's answer says `Connection: close`: close, lingering first if the request's body is still coming.

        NOTE: closed at once with bytes of the body unread, the kernel answers the client's next bytes with a
        reset, which can destroy the answer (a 413 for a body over the limit) before the client reads it.
        """
        if self._in_head or not cycle.response_complete or self.transport.is_closing():
            self.transport.close()
            return
        self._lingering = True
        self._linger()

    def _refuse(self, status: bytes, message: bytes) -> None:
        self._refused = True
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(message), message)
        )
        self._linger()

    def _linger(self) -> None:
        """Half-close after what is written, drop what the client still sends, close after LINGER_S."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._unset_keepalive_if_required()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
