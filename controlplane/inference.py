"""One inference request served, whatever carried it: the ASGI front on the event loop, or the Flask view.

Two transports answer `POST /v2/models/<name>[/versions/<version>]/infer`, and both go through `Call`:
- `controlplane.asgi.Front` (the usual path under gunicorn) reads the body on uvicorn's event loop,
  drives a `Call` itself (`admit`, `decode`, `engine.submit` and `engine.finish` on the loop,
  `succeeded` or `refused`, `log`) and writes the `Answer` as ASGI messages;
- the Flask view (`inference_api`), for the requests the front hands to Flask (FLIGHTDECK_INFERENCE_AUTH
  on, a session cookie, a mount point, a path that is not ASCII) and under Flask's own test client,
  calls `serve`, which runs the same `Call` in the request's thread with `engine.infer`.
There is no WSGI fast path any more: a request either reaches the front's loop or Flask's view.

The transport hands over the request's header lookup and a body reader; `Call` admits, decodes,
encodes, counts and logs, and returns an `Answer` (status, body, headers) that the caller writes in
its own way. A `ServingError` becomes its {"error": "..."} answer here; anything else propagates, so
each caller answers it as the app's handler for unexpected errors does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from werkzeug.wsgi import get_content_length, get_input_stream

from controlplane import metrics
from controlplane.config import Settings
from controlplane.requestlog import log_request
from serving.codec import HEADER_LENGTH, InferRequest, OutputRequest, decode_request, encode_response, select_outputs
from serving.engine import Engine, Routed
from serving.errors import InvalidInput, Overloaded, PayloadTooLarge, ServingError, client_error_kind

if TYPE_CHECKING:
    from controlplane.tracing import RequestTrace, Tracing

JSON = "application/json"
BINARY = "application/octet-stream"

HeaderLookup = Callable[[str], "str | None"]  # a header's value by its name, None when absent
BodyReader = Callable[[int], bytes]  # reads the whole body, raising PayloadTooLarge over the given limit
Encoded = TypeVar("Encoded")


@dataclass(slots=True)
class Answer:
    """What to send back: status, body, content type and the headers particular to this answer."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: list[tuple[str, str]] = field(default_factory=list)


def error_answer(exc: ServingError) -> Answer:
    """Answer a serving error in the protocol's form, with Retry-After when the queue was full."""
    answer = Answer(exc.status, json.dumps({"error": exc.message}).encode())
    if isinstance(exc, Overloaded):
        answer.headers.append(("Retry-After", str(exc.retry_after)))
    return answer


def read_body(environ: dict[str, Any], limit: int) -> bytes:
    """Read a WSGI request's body, refusing one over `limit` bytes (413) as Flask's request would.

    NOTE: the same Werkzeug calls `request.content_length` and `request.stream` make, so this refuses as
    Flask's request would; a chunked body past the limit raises Werkzeug's RequestEntityTooLarge. (The
    ASGI front reads its bodies with `asgi.read_body`, to the same limit.)
    """
    length = get_content_length(environ)
    if length is not None and length > limit:
        raise PayloadTooLarge(f"request body of {length} bytes is over the limit of {limit}")
    body = get_input_stream(environ, max_content_length=limit).read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
    return body


def too_many_values(limit: int) -> PayloadTooLarge:
    """The refusal of a request whose JSON holds more than `limit` values."""
    return PayloadTooLarge(
        f"the request's JSON holds more than {limit} values (FLIGHTDECK_MAX_REQUEST_VALUES); "
        "send large tensors with the binary tensor extension"
    )


def header_length(raw: str | None) -> int | None:
    """Parse Inference-Header-Content-Length (the binary tensor extension's JSON part), if given."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer, not {raw!r}")
    return int(raw)


class Call:
    """One inference request's life after its transport parsed it: decode, outcome, answer, log line.

    Both transports drive it the same way: `admit`, `decode` the body, run (`engine.infer`, or
    `engine.submit` and `finish` on an event loop), then `succeeded` or `refused`, and `log` at the end.
    """

    __slots__ = (
        "engine",
        "settings",
        "name",
        "header",
        "started",
        "record",
        "status",
        "decoded",
        "decode_ns",
        "decode_ms",
        "trace",
    )

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        name: str,
        version: str | None,
        request_id: str,
        header: HeaderLookup,
        tracing: Tracing | None = None,
        span_name: str | None = None,
    ) -> None:
        """Begin the call; with `tracing`, its span continues the caller's `traceparent` (read through `header`)."""
        self.engine, self.settings, self.name, self.header = engine, settings, name, header
        self.started = time.perf_counter()
        self.record: dict = {"request_id": request_id, "model": name, "version": version}
        self.status = 500
        self.decoded: InferRequest | None = None
        self.decode_ns = 0
        self.decode_ms = 0.0
        self.trace: RequestTrace | None = None
        if tracing is not None:
            route = "/v2/models/{model}/infer" if version is None else "/v2/models/{model}/versions/{version}/infer"
            self.trace = tracing.request(span_name or f"POST {route}", header, name, request_id, self.record)

    def admit(self) -> None:
        """Refuse at once when every queue of the model is full: before decoding, so the excess is cheap."""
        if self.trace is None:
            self.engine.check_admission(self.name)
            return
        with self.trace.step("admission"):
            self.engine.check_admission(self.name)

    def decode(self, body: bytes) -> dict[str, Any]:
        """Decode the body; return the keyword arguments of `engine.infer` (and `submit`) after the model's name."""
        return self.decode_with(lambda: self._decode(body))

    def decode_with(self, decode: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run `decode` (ending in `accept`) as the request's decode step: a transport's own decoder (gRPC's)."""
        if self.trace is None:
            return decode()
        with self.trace.step("decode"):
            routing = decode()
        if self.trace.recording:  # the batch that runs it will be linked to its span
            routing["trace"] = self.trace.span_context
            self.trace.queued()
        return routing

    def _decode(self, body: bytes) -> dict[str, Any]:
        decode_started = time.perf_counter_ns()
        json_length = header_length(self.header(HEADER_LENGTH))
        limit = self.settings.max_request_values
        # NOTE: an upper bound on the JSON's values (each but the last of an array is followed by a comma),
        # counted in C at memchr speed before the parse, which holds the GIL for as long as it takes.
        if len(body) > limit and body.count(b",", 0, json_length) >= limit:
            raise too_many_values(limit)
        return self.accept(decode_request(body, json_length), decode_started)

    def accept(self, decoded: InferRequest, decode_started: int, deadline_s: float | None = None) -> dict[str, Any]:
        """Take a decoded request (`decode_started` from perf_counter_ns); return `engine.infer`'s keyword arguments.

        `deadline_s`, the seconds the transport's own deadline leaves (gRPC's), shortens the request's as
        its `timeout` parameter would.
        """
        self.decoded = decoded
        self.decode_ns = time.perf_counter_ns() - decode_started
        self.decode_ms = (time.perf_counter() - self.started) * 1000  # the body's reading included
        timeout_us = decoded.timeout_us
        timeout_s = None if timeout_us is None else timeout_us / 1e6
        if deadline_s is not None:
            timeout_s = deadline_s if timeout_s is None else min(timeout_s, deadline_s)
        return {
            "tensors": decoded.tensors,
            "version": self.record["version"],
            "timeout_s": timeout_s,
            "route_key": self.header("X-Route-Key"),
            "outputs": None if decoded.outputs is None else [o.name for o in decoded.outputs],
        }

    def succeeded(self, routed: Routed) -> Answer:
        """Encode the outputs the request asked for; count the codec time; the 200 answer."""
        decoded = self.decoded
        assert decoded is not None  # decode ran before the engine could answer
        body, json_length = self.encode(
            routed, lambda wanted: encode_response(self.name, routed.version, decoded.id, routed.outputs, wanted)
        )
        answer = Answer(200, body, JSON if json_length is None else BINARY)
        if json_length is not None:
            answer.headers.append((HEADER_LENGTH, str(json_length)))
        answer.headers.append(("X-Model-Version", routed.version))
        answer.headers.append(("X-Model-Slot", routed.slot))
        return answer

    def encode(self, routed: Routed, encoder: Callable[[list[OutputRequest]], Encoded]) -> Encoded:
        """Record the answer's routing and times, encode the outputs asked for with `encoder`, count the codec time."""
        decoded = self.decoded
        assert decoded is not None  # decode ran before the engine could answer
        record = self.record
        record.update(version=routed.version, slot=routed.slot, batch_size=routed.batch_size)
        record.update(
            decode_ms=round(self.decode_ms, 3),
            queue_ms=round(routed.queue_s * 1000, 3),
            compute_ms=round(routed.compute_s * 1000, 3),
        )
        encode_started = time.perf_counter_ns()
        if self.trace is None:
            encoded = encoder(select_outputs(decoded, list(routed.outputs)))
        else:
            self.trace.routed(
                self.name, routed.version, routed.slot, routed.batch_size, routed.queue_s, routed.compute_s
            )
            with self.trace.step("encode"):
                encoded = encoder(select_outputs(decoded, list(routed.outputs)))
        _record_codec(self.engine, self.name, routed, self.decode_ns, time.perf_counter_ns() - encode_started)
        self.status = 200
        return encoded

    def refused(self, exc: ServingError) -> Answer:
        """Answer a ServingError in the protocol's form; count an invalid request."""
        self.status = exc.status
        self.record["error"] = exc.message
        if exc.version is not None:  # routed before it failed: the line names the version and slot
            self.record.update(version=exc.version, slot=exc.slot)
        # NOTE: a refusal once routed (its shape, its datatype, an unknown input; or the runtime's) was
        # counted by the version that refused it; one before (its body, its size, a version not loaded)
        # counts in the version it would have gone to, so every refused request is a client error there.
        kind = client_error_kind(exc)
        if kind is not None and exc.version is None:
            version, route_key = self.record["version"], self.header("X-Route-Key")
            if not self.engine.refused(self.name, kind, version, route_key):
                # Nothing to count it in: unknown names share one label, so made-up ones cannot grow the series.
                metrics.record_invalid(self.name if self.name in self.engine.models() else "_unknown")
        return error_answer(exc)

    def log(self) -> None:
        """Write the request's log line (sampled; slow and failed requests always); end its span."""
        if self.trace is not None:
            self.trace.end(self.status, self.record)
        log_request(
            self.record,
            status=self.status,
            total_ms=(time.perf_counter() - self.started) * 1000,
            sample_rate=self.settings.log_sample_rate,
            slow_ms=self.settings.slow_request_ms,
            tensors=None if self.decoded is None else self.decoded.tensors,
        )


def serve(
    engine: Engine,
    settings: Settings,
    name: str,
    version: str | None,
    request_id: str,
    header: HeaderLookup,
    read_body: BodyReader,
    tracing: Tracing | None = None,
) -> Answer:
    """Run one inference request in this thread: JSON tensors, or JSON then binary tensors (the binary extension)."""
    call = Call(engine, settings, name, version, request_id, header, tracing)
    try:
        call.admit()
        routing = call.decode(read_body(settings.max_request_bytes))
        return call.succeeded(engine.infer(name, **routing))
    except ServingError as exc:
        return call.refused(exc)
    finally:
        call.log()


def _record_codec(engine: Engine, name: str, routed: Routed, decode_ns: int, encode_ns: int) -> None:
    """Count a successful request's decode and encode time in the statistics of the version that ran it."""
    for loaded in engine.loaded(name):
        if loaded.slot == routed.slot and loaded.spec.version == routed.version:
            loaded.batcher.record_codec(decode_ns, encode_ns)
            return
    # NOTE: a version unloaded while this request was encoded has no statistics left to count in.


async def run_on_loop(engine: Engine, name: str, routing: dict[str, Any]) -> Routed:
    """Queue the request in the engine and wait for it without blocking the loop; refuse it at its deadline."""
    loop = asyncio.get_running_loop()
    answered = loop.create_future()

    def on_done(_pending: object) -> None:  # in the executor's thread
        try:
            loop.call_soon_threadsafe(_wake, answered)
        except RuntimeError:  # the loop has closed (the worker stopped): nobody waits for this answer
            pass

    ticket = engine.submit(name, on_done=on_done, **routing)
    # NOTE: the batcher's own clock is time.monotonic, as is the loop's; a request still queued at its
    # deadline is refused then, as a waiting thread would refuse it (Batcher.result).
    timer = loop.call_later(max(0.0, ticket.pending.deadline - time.monotonic()), ticket.expire)
    try:
        await answered
    finally:
        timer.cancel()
    return engine.finish(ticket)


def _wake(answered: asyncio.Future[None]) -> None:
    if not answered.done():
        answered.set_result(None)
