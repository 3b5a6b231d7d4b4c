"""OpenTelemetry traces: configured by the standard OTEL_* variables, off unless an OTLP endpoint is set.

On (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, `OTEL_SDK_DISABLED` not
true, `OTEL_TRACES_EXPORTER` unset or `otlp`), each serving process builds its own tracer provider
(after gunicorn's fork) with the SDK's batch span processor and OTLP exporter; the SDK itself reads
the sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`; the service is `flightdeck` unless they say otherwise), the exporter's
headers, timeout and compression, and the processor's `OTEL_BSP_*` limits. Off, nothing here is
built and the hot path pays one `is None` test per step.

What is traced:
- an inference request (`RequestTrace`): a SERVER span continuing the caller's W3C `traceparent` /
  `tracestate`, with children for admission, decode, the wait in the queue and encode;
- each batch that ran with at least one sampled request (`BatchSpans`, serving's `BatchTracer`):
  one span, child of the first sampled request's span and linked to every sampled request's span,
  so a request's trace holds the run when it ran alone and points to the shared run otherwise;
- rollout actions, runbook runs and alert notifications (`span`).

A request's trace and span ids go in its request log line; the JSON logs written while a span is
current carry them too (`current_ids`, read by `logconfig`'s filter).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

from controlplane import exemplars

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanContext, Tracer

    from serving.batchstats import RequestOutcome

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

HeaderLookup = Callable[[str], "str | None"]  # a header's (or gRPC metadata key's) value, None when absent
MAX_TRACEPARENT = 512  # the propagator's own bound; longer values are ignored here, unlogged
DEFAULT_SERVICE = "flightdeck"

_active: Tracing | None = None  # this process's, once `configure` turned tracing on


class TracingConfigError(ValueError):
    """An OTEL_* variable asks for something Flightdeck cannot do (the message names it)."""


def enabled(environ: Mapping[str, str]) -> bool:
    """Say whether these variables turn tracing on: an OTLP endpoint, and nothing that turns it off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(node: str = "", environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Build this process's tracing from the OTEL_* variables; None (and nothing imported) when off.

    `environ` decides whether tracing is on and with which exporter (tests pass their own); the SDK
    then reads everything else (endpoint, sampler, resource, headers) from the process's environment.
    """
    global _active
    environ = os.environ if environ is None else environ
    if not enabled(environ):
        return None
    exporter_kind = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter_kind != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER: only 'otlp' or 'none' are supported, not {exporter_kind!r}")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip() or "http/protobuf"
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    elif protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the opentelemetry-exporter-otlp-proto-grpc package; "
                "install it, or use http/protobuf (the default)"
            ) from None
    else:
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf' (the default) or 'grpc', not {protocol!r}"
        )
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from controlplane import __version__

    own = {
        "service.name": DEFAULT_SERVICE,
        "service.version": __version__,
        "service.instance.id": f"{node}:{os.getpid()}",
    }
    # NOTE: what OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say wins over our defaults.
    resource = Resource.create(own).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _active = Tracing(provider)
    log.info("tracing on: OTLP %s to %s", protocol, _endpoint(environ))
    return _active


def lookup_of(carrier: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> HeaderLookup:
    """Return a lookup by lower-case name over headers or gRPC metadata (a mapping, or (key, value) pairs).

    For a transport other than the ASGI front, e.g. gRPC: `Call(engine, settings, name, version,
    request_id, tracing.lookup_of(context.invocation_metadata()), services.tracing,
    span_name="/inference.GRPCInferenceService/ModelInfer")` continues the caller's `traceparent`
    exactly as a REST request does. Binary metadata (`-bin` keys, bytes values) is left out.
    """
    items = carrier.items() if isinstance(carrier, Mapping) else carrier
    return {str(k).lower(): v for k, v in items if isinstance(v, str)}.get


def active() -> Tracing | None:
    """Return this process's tracing, or None when it is off."""
    return _active


def _endpoint(environ: Mapping[str, str]) -> str:
    """The endpoint as logged: scheme, host and port only (a URL may carry credentials or a key)."""
    url = urlsplit(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
    try:
        port = url.port
    except ValueError:  # the exporter will say what is wrong with it; the log line only names the host
        port = None
    return f"{url.scheme}://{url.hostname or ''}{f':{port}' if port else ''}"


class Tracing:
    """One process's tracer: request spans, batch spans, spans around operations."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("flightdeck")
        # NOTE: bound once here: the request path pays no import look-ups.
        self._trace = trace
        self._context = context
        self._server = trace.SpanKind.SERVER
        self._propagator = TraceContextTextMapPropagator()

    def parent(self, lookup: HeaderLookup) -> Context:
        """Return the context a caller's W3C `traceparent`/`tracestate` continue (empty when absent or invalid).

        `lookup` gives a header's value by its lower-case name: `headers.get` of an HTTP request, or
        `dict(context.invocation_metadata()).get` of a gRPC call (metadata keys are lower-case).
        """
        return self._propagator.extract(lookup, getter=_LOOKUP_GETTER)

    def request(
        self, span_name: str, lookup: HeaderLookup, model: str, request_id: str, record: dict[str, Any]
    ) -> RequestTrace:
        """Start an inference request's SERVER span under the caller's context; put its ids in `record`."""
        span = self.tracer.start_span(
            span_name,
            context=self._propagator.extract(lookup, getter=_LOOKUP_GETTER),
            kind=self._server,
            attributes={"flightdeck.model": model, "flightdeck.request_id": request_id},
        )
        return RequestTrace(self, span, record)

    def batch_tracer(self, model: str, version: str, slot: str) -> BatchSpans:
        """Return the batch tracer of one loaded version (serving's `TracerFactory`)."""
        return BatchSpans(self, model, version, slot)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """Run the body in a span, current (so its logs and child spans join it); an escaping error marks it."""
        with self.tracer.start_as_current_span(name, attributes=dict(attributes)) as current:
            yield current

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export every finished span now; return whether it was done in time."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is left and stop the exporter's thread."""
        global _active
        self.provider.shutdown()
        if _active is self:
            _active = None


class _LookupGetter:
    """The propagator's getter over a header lookup function (OpenTelemetry's `Getter` protocol)."""

    def get(self, carrier: HeaderLookup, key: str) -> list[str] | None:
        value = carrier(key)
        if value is None or len(value) > MAX_TRACEPARENT:
            return None
        return [value]

    def keys(self, carrier: HeaderLookup) -> list[str]:
        return []


_LOOKUP_GETTER = _LookupGetter()


def _hex_ids(span_context: SpanContext) -> tuple[str, str]:
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


class RequestTrace:
    """One inference request's span and its children; a request the sampler left out records nothing."""

    __slots__ = ("_tracing", "span", "context", "span_context", "recording", "enqueued_ns", "_token")
    context: Context  # the request span's, for its children (set only when it records)

    def __init__(self, tracing: Tracing, span: Span, record: dict[str, Any]) -> None:
        self._tracing = tracing
        self.span = span
        self.span_context = span.get_span_context()
        self.recording = span.is_recording()
        self.enqueued_ns = 0
        record["trace_id"], record["span_id"] = _hex_ids(self.span_context)
        if self.recording:
            self.context = tracing._trace.set_span_in_context(span)
            # NOTE: current while the request is handled, in this task or thread only: logs carry its ids.
            self._token = tracing._context.attach(self.context)

    def step(self, name: str) -> Step | nullcontext:
        """Return a context manager timing one step of the request as a child span (nothing when unsampled)."""
        if not self.recording:
            return nullcontext()
        return Step(self._tracing.tracer.start_span(name, context=self.context))

    def queued(self) -> None:
        """Note that the request is about to enter the queue (the start of its queue wait)."""
        self.enqueued_ns = time.time_ns()

    def routed(self, model: str, version: str, slot: str, batch_size: int, queue_s: float, compute_s: float) -> None:
        """Name where the request ran; add its queue wait as a child span (the batcher's measure); offer an exemplar."""
        if not self.recording:
            return
        trace_id, span_id = _hex_ids(self.span_context)
        exemplars.offer(model, version, slot, queue_s + compute_s, trace_id, span_id)
        self.span.set_attributes(
            {"flightdeck.model.version": version, "flightdeck.slot": slot, "flightdeck.batch.size": batch_size}
        )
        if self.enqueued_ns:
            wait = self._tracing.tracer.start_span("queue wait", context=self.context, start_time=self.enqueued_ns)
            wait.end(end_time=self.enqueued_ns + int(queue_s * 1e9))

    def end(self, status: int, record: dict[str, Any]) -> None:
        """End the request's span with its status and outcome; stop it being current."""
        if not self.recording:
            return  # NOTE: an unsampled span records nothing; ending it would only cost time
        span = self.span
        try:
            attributes: dict[str, Any] = {"http.response.status_code": status, "flightdeck.outcome": outcome(status)}
            if record.get("version") is not None:
                attributes["flightdeck.model.version"] = record["version"]
            if record.get("slot") is not None:
                attributes["flightdeck.slot"] = record["slot"]
            span.set_attributes(attributes)
            if status >= 500:  # as OpenTelemetry's HTTP server conventions: a 4xx is the caller's, not an error
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, record.get("error")))
            span.end()
        finally:
            self._tracing._context.detach(self._token)


class Step:
    """A child span around one step; an exception leaving it names its type on the span."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is not None:
            self.span.set_attribute("error.type", kind.__name__)
        self.span.end()


def outcome(status: int) -> str:
    """Word a request's HTTP status as the outcomes the batcher counts (serving.batchstats.RequestOutcome)."""
    if status < 400:
        return "success"
    if status in (429, 503):
        return "rejected"
    if status == 504:
        return "timeout"
    return "error" if status >= 500 else "client_error"


class BatchSpans:
    """serving's `BatchTracer` for one loaded version: one span per batch run (see the module's docstring)."""

    def __init__(self, tracing: Tracing, model: str, version: str, slot: str) -> None:
        self._tracing = tracing
        self._attributes = {"flightdeck.model": model, "flightdeck.model.version": version, "flightdeck.slot": slot}

    def batch_ran(
        self, traces: list[object], size: int, compute_s: float, outcomes: list[RequestOutcome], extra_runs: int
    ) -> None:
        """Record the batch that just ended as a span, parented and linked as the module's docstring says."""
        from opentelemetry.trace import Link, NonRecordingSpan

        end = time.time_ns()
        contexts: list[SpanContext] = traces  # type: ignore[assignment]  # what RequestTrace hands the engine
        kinds = {str(o) for o in outcomes}
        attributes = {
            **self._attributes,
            "flightdeck.batch.size": size,
            "flightdeck.batch.requests": len(outcomes),
            "flightdeck.batch.bisect_runs": extra_runs,
            "flightdeck.outcome": kinds.pop() if len(kinds) == 1 else "mixed",
        }
        trace = self._tracing._trace
        span = self._tracing.tracer.start_span(
            "batch run",
            context=trace.set_span_in_context(NonRecordingSpan(contexts[0])),
            links=[Link(c) for c in contexts],
            attributes=attributes,
            start_time=end - int(compute_s * 1e9),
        )
        span.end(end_time=end)


class _NoSpan:
    """What `span` yields when tracing is off: attributes set on it go nowhere."""

    def set_attribute(self, key: str, value: object) -> None:
        pass


_NO_SPAN = _NoSpan()


def span(name: str, **attributes: Any) -> Any:
    """Run the body in a span of this process's tracing (a no-op when tracing is off); yield the span.

    For operations worth seeing in a trace: `with tracing.span("alert.notification", receiver=r) as s: ...`;
    each attribute is recorded as `flightdeck.<name>`; None values are left out.
    """
    tracing = _active
    if tracing is None:
        return nullcontext(_NO_SPAN)
    return tracing.span(name, {f"flightdeck.{k}": v for k, v in attributes.items() if v is not None})


def traced(name: str, *arguments: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function so each call runs in the span `name`, the named arguments as its attributes.

    `@traced("rollout.rollback", "model")` on `rollback(session, model, ...)` records `flightdeck.model`.
    Off, a call costs one test more.
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if _active is None:
                return function(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs).arguments
            with span(name, **{a: _attribute(bound.get(a)) for a in arguments}):
                return function(*args, **kwargs)

        return call

    return decorate


def _attribute(value: object) -> object:
    """An attribute value OpenTelemetry takes: str, bool, int, float as they are; anything else as its str."""
    return value if value is None or isinstance(value, str | bool | int | float) else str(value)


def current_ids() -> tuple[str, str] | None:
    """Return the current span's trace and span ids in hex, or None (no span, or tracing off)."""
    tracing = _active
    if tracing is None:
        return None
    span_context = tracing._trace.get_current_span().get_span_context()
    return _hex_ids(span_context) if span_context.is_valid else None
