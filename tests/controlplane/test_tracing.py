"""OpenTelemetry traces (controlplane.tracing) exported to a real OTLP/HTTP receiver on 127.0.0.1.

The receiver is a plain HTTP server decoding what the SDK's exporter sends with opentelemetry-proto's
own messages. Requests go through the ASGI front in process (the real engine, its batcher threads,
the real exporter over HTTP), with tracing turned on the way an operator would: OTEL_* variables.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from flask import Flask
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from controlplane import tracing
from controlplane.asgi import Front
from controlplane.logconfig import RequestIdFilter
from tests.aio import run_async
from tests.controlplane.test_asgi import _asgi
from tests.controlplane.test_inference_api import MLP, mlp_body
from tests.servers import free_port, start_server

ROOT = Path(__file__).resolve().parents[2]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@dataclass
class Received:
    """One exported span, flattened from the protobuf."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    trace_state: str
    kind: int
    attributes: dict
    links: list[tuple[str, str]]
    resource: dict


def _value(any_value) -> object:
    return getattr(any_value, any_value.WhichOneof("value"))


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
                if ok:
                    receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        Received(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.trace_state,
                            s.kind,
                            {a.key: _value(a.value) for a in s.attributes},
                            [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            resource,
                        )
                    )
        with self.changed:
            self.spans.extend(spans)
            self.changed.notify_all()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def traced(receiver: Receiver, monkeypatch: pytest.MonkeyPatch, app_config: dict) -> None:
    """Tracing on as an operator turns it on; each test sees only its own spans."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    app_config.update(warmup_max_sequence=16, batch_instances=1)
    with receiver.changed:
        receiver.spans.clear()


def exported(app: Flask, receiver: Receiver) -> list[Received]:
    """Export every finished span now and return what the receiver decoded."""
    assert app.extensions["flightdeck"].tracing.flush(10)
    with receiver.changed:
        return list(receiver.spans)


def post(front: Front, headers: dict[str, str], seed: int = 0):
    body = json.dumps(mlp_body(1, seed)).encode()
    return _asgi(front, f"{MLP}/infer", body, {"Content-Type": "application/json", **headers}, "POST", None)


def test_a_request_continues_the_callers_trace(app: Flask, receiver: Receiver) -> None:
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "vendor=abc", "X-Request-ID": "r1"}
    reply = run_async(lambda: post(Front(app), headers))
    assert reply.status == 200
    spans = exported(app, receiver)
    assert {s.trace_id for s in spans} == {CALLER_TRACE}
    (server,) = [s for s in spans if s.name == "POST /v2/models/{model}/infer"]
    assert (server.parent, server.kind, server.trace_state) == (CALLER_SPAN, 2, "vendor=abc")  # 2: SERVER
    assert server.attributes == {
        "flightdeck.model": "mlp",
        "flightdeck.request_id": "r1",
        "flightdeck.model.version": "1",
        "flightdeck.slot": "blue",
        "flightdeck.batch.size": 1,
        "http.response.status_code": 200,
        "flightdeck.outcome": "success",
    }
    children = {s.name: s for s in spans if s.parent == server.span_id}
    assert sorted(children) == ["admission", "batch run", "decode", "encode", "queue wait"]
    run = children["batch run"]  # it ran alone (the executor was idle): a child of its only request
    assert run.links == [(CALLER_TRACE, server.span_id)]
    assert run.attributes["flightdeck.batch.size"] == 1
    assert run.attributes["flightdeck.outcome"] == "success"
    assert (run.attributes["flightdeck.model.version"], run.attributes["flightdeck.slot"]) == ("1", "blue")
    assert server.resource["service.name"] == "flightdeck"

    # The request log line names the same trace and span.
    lines = (app.extensions["flightdeck"].settings.log_dir / "requests.log").read_text().splitlines()
    line = next(json.loads(x) for x in lines if json.loads(x)["request_id"] == "r1")
    assert (line["trace_id"], line["span_id"]) == (CALLER_TRACE, server.span_id)

    # An OpenMetrics scrape shows it as the exemplar of its latency bucket; the text format has none.
    client = app.test_client()
    scraped = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert scraped.headers["Content-Type"].startswith("application/openmetrics-text")
    buckets = [x for x in scraped.text.splitlines() if x.startswith("flightdeck_inference_request_seconds_bucket")]
    (exemplified,) = [x for x in buckets if CALLER_TRACE in x]
    assert 'model="mlp"' in exemplified and f'# {{span_id="{server.span_id}",trace_id="{CALLER_TRACE}"}}' in exemplified
    assert "trace_id" not in client.get("/metrics").text


class HoldFirstBatch(SpanProcessor):
    """Holds the executor thread that ends the first 'batch run' span until released (a public SDK hook)."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def on_end(self, span: ReadableSpan) -> None:
        if span.name == "batch run" and not self.entered.is_set():
            self.entered.set()
            self.release.wait(10)


def test_requests_batched_together_share_one_run_span_linked_to_each(app: Flask, receiver: Receiver) -> None:
    services = app.extensions["flightdeck"]
    hold = HoldFirstBatch()
    services.tracing.provider.add_span_processor(hold)
    (loaded,) = services.engine.loaded("mlp")
    front = Front(app)
    callers = [f"{i + 1:032x}" for i in range(4)]

    async def scenario() -> list:
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(post(front, {"traceparent": f"00-{callers[0]}-{CALLER_SPAN}-01"}))
        assert await loop.run_in_executor(None, hold.entered.wait, 10)  # its batch ran; its executor is held
        rest = [
            asyncio.create_task(post(front, {"traceparent": f"00-{t}-{CALLER_SPAN}-01"}, seed=i))
            for i, t in enumerate(callers[1:])
        ]
        for _ in range(1000):  # until the three wait in the queue together (each decode is ~0.1 ms)
            if loaded.batcher.queue_depth == 3:
                break
            await asyncio.sleep(0.01)
        assert loaded.batcher.queue_depth == 3
        hold.release.set()
        return await asyncio.gather(first, *rest)

    try:
        replies = run_async(scenario)
    finally:
        hold.release.set()
    assert [r.status for r in replies] == [200] * 4
    spans = exported(app, receiver)
    servers = {s.trace_id: s for s in spans if s.name == "POST /v2/models/{model}/infer"}
    runs = [s for s in spans if s.name == "batch run"]
    assert len(runs) == 2
    alone, shared = sorted(runs, key=lambda s: len(s.links))
    assert alone.links == [(callers[0], servers[callers[0]].span_id)]
    assert shared.links == [(t, servers[t].span_id) for t in callers[1:]]  # in batch (arrival) order
    assert shared.attributes["flightdeck.batch.size"] == shared.attributes["flightdeck.batch.requests"] == 3
    # Its parent is the first request of the batch; the others reach it through their link.
    assert (shared.trace_id, shared.parent) == (callers[1], servers[callers[1]].span_id)
    for t in callers[1:]:
        assert servers[t].attributes["flightdeck.batch.size"] == 3
        waits = [s for s in spans if s.name == "queue wait" and s.parent == servers[t].span_id]
        assert len(waits) == 1


def test_an_unsampled_request_records_nothing_but_its_ids_are_logged(
    app_config: dict, monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    from controlplane.app import create_app

    app = create_app(app_config)
    try:
        front = Front(app)
        dropped = run_async(lambda: post(front, {"X-Request-ID": "unsampled"}))
        # The caller sampled this one: parent-based sampling keeps it whatever the ratio.
        kept = run_async(lambda: post(front, {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}))
        assert dropped.status == kept.status == 200
        spans = exported(app, receiver)
    finally:
        app.extensions["flightdeck"].shutdown(5)
    assert {s.trace_id for s in spans} == {CALLER_TRACE}
    lines = (app.extensions["flightdeck"].settings.log_dir / "requests.log").read_text().splitlines()
    line = next(json.loads(x) for x in lines if json.loads(x)["request_id"] == "unsampled")
    assert len(line["trace_id"]) == 32 and line["trace_id"] != CALLER_TRACE


def test_tracing_stays_off_without_an_endpoint_or_when_disabled() -> None:
    assert not tracing.enabled({})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})
    assert tracing.enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x"})
    assert tracing.configure("n", {}) is None
    with pytest.raises(tracing.TracingConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        tracing.configure("n", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(tracing.TracingConfigError, match="OTEL_TRACES_EXPORTER"):
        tracing.configure("n", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "zipkin"})


def test_a_rollout_action_is_a_span_and_json_logs_inside_it_carry_its_ids(
    app: Flask, client, operator: dict[str, str], receiver: Receiver
) -> None:
    assert client.post("/api/models/textcls/undeploy", headers=operator).status_code == 200
    (undeploy,) = [s for s in exported(app, receiver) if s.name == "rollout.undeploy"]
    assert undeploy.attributes == {"flightdeck.model": "textcls"}

    record = logging.LogRecord("controlplane.x", logging.INFO, __file__, 1, "inside", None, None)
    with tracing.span("runbook.run", run_id=7) as current:
        RequestIdFilter().filter(record)
        ids = (format(current.get_span_context().trace_id, "032x"), format(current.get_span_context().span_id, "016x"))
    assert (record.trace_id, record.span_id) == ids
    outside = logging.LogRecord("controlplane.x", logging.INFO, __file__, 1, "outside", None, None)
    RequestIdFilter().filter(outside)
    assert not hasattr(outside, "trace_id")


def test_another_transport_continues_a_trace_from_its_metadata(app: Flask, receiver: Receiver) -> None:
    metadata = [("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"), ("x-bin", b"\x00"), ("TraceState", "k=v")]
    record: dict = {}
    services = app.extensions["flightdeck"]
    span_name = "/inference.GRPCInferenceService/ModelInfer"
    request = services.tracing.request(span_name, tracing.lookup_of(metadata), "mlp", "g1", record)
    request.end(200, record)
    (span,) = [s for s in exported(app, receiver) if s.name == span_name]
    assert (span.trace_id, span.parent, span.trace_state) == (CALLER_TRACE, CALLER_SPAN, "k=v")
    assert (record["trace_id"], record["span_id"]) == (CALLER_TRACE, span.span_id)


@pytest.mark.slow
def test_a_real_server_traces_in_its_worker_and_exports_what_is_left_when_it_stops(
    home: Path, receiver: Receiver
) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    # The batch processor's default 5 s delay: what arrives, arrives because the worker flushed at its exit.
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "fd-test"}
    grpc_port = free_port()
    server = start_server(home, env={**env, "FLIGHTDECK_GRPC_PORT": str(grpc_port)})
    grpc_caller = "0af7651916cd43dd8448eb211c80319c"
    try:
        for caller in (CALLER_TRACE, CALLER_TRACE[::-1]):
            status, _, headers = server.post(
                f"{MLP}/infer", mlp_body(1), {"traceparent": f"00-{caller}-{CALLER_SPAN}-01"}
            )
            assert status == 200
        # The same over gRPC: the caller's traceparent travels in the call's metadata.
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        features = grpcclient.InferInput("input", [1, 64], "FP32")
        features.set_data_from_numpy(np.full((1, 64), 0.5, np.float32))
        client.infer("mlp", [features], headers={"traceparent": f"00-{grpc_caller}-{CALLER_SPAN}-01"})
        client.close()
    finally:
        assert server.stop() == 0
    with receiver.changed:
        spans = [s for s in receiver.spans if s.name == "POST /v2/models/{model}/infer"]
        grpc_spans = [s for s in receiver.spans if s.name == "/inference.GRPCInferenceService/ModelInfer"]
    assert sorted((s.trace_id, s.parent) for s in spans) == sorted(
        [(CALLER_TRACE, CALLER_SPAN), (CALLER_TRACE[::-1], CALLER_SPAN)]
    )
    assert [(s.trace_id, s.parent, s.attributes.get("flightdeck.model")) for s in grpc_spans] == [
        (grpc_caller, CALLER_SPAN, "mlp")
    ]
    for span in spans:
        assert span.resource["service.name"] == "fd-test"
        node, pid = span.resource["service.instance.id"].rsplit(":", 1)
        assert int(pid) != server.process.pid  # built in the worker, after gunicorn's fork, not in the master


def test_gunicorn_config_loads_prometheus_client_only_after_choosing_multiprocess_mode(tmp_path: Path) -> None:
    # NOTE: gunicorn.conf.py imports logconfig (and so tracing and exemplars) before it sets
    # PROMETHEUS_MULTIPROC_DIR; prometheus_client picks its value class once, when first imported.
    code = (
        "import runpy, sys; runpy.run_path('gunicorn.conf.py'); import prometheus_client.values as v; "
        "sys.exit(0 if v.ValueClass is not v.MutexValue else 'prometheus_client loaded before multiprocess mode')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["FLIGHTDECK_HOME"] = str(tmp_path / "home")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
