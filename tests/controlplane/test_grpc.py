"""The Open Inference Protocol over gRPC: Triton's own `tritonclient.grpc`, unchanged, against the real product.

One server for the module (gunicorn on 127.0.0.1, HTTP and gRPC on free ports) serves every test but the
drain's, which stops its own. Typed `contents` requests (tritonclient always sends raw bytes) are built
with tritonclient's own generated messages and stub, which are Triton's published ones.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_home
from tests.servers import Server, free_port, push_and_deploy, start_server, wait_until
from tests.signature_models import (
    ONNX_TYPES,
    sample_of,
    strings_reference,
    vad_reference,
    write_alltypes,
    write_strings,
    write_vad,
)

pytestmark = pytest.mark.slow


def make_token(home: Path, name: str, role: str) -> str:
    """Create a user with `role` in the server's database and return an API token of theirs."""
    from controlplane.auth import tokens, users
    from controlplane.auth.roles import Role
    from controlplane.db import make_engine, session_factory

    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    try:
        with session_factory(engine)() as session:
            now = datetime.now(UTC)
            user = users.create_user(session, name, f"{name}-password-1", Role(role), now)
            _, secret = tokens.create_token(session, user, name, Role(role), now)
            session.commit()
    finally:
        engine.dispose()
    return secret


@pytest.fixture(scope="module")
def grpc_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("grpc") / "home"
    copy_home(template_home, home)
    port = free_port()
    server = start_server(home, env={"FLIGHTDECK_ROLLOUT_TICK_S": "0.1", "FLIGHTDECK_GRPC_PORT": str(port)})
    server.grpc = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def triton(grpc_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(url=grpc_server.grpc)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(grpc_server: Server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(grpc_server.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def operator(grpc_server: Server) -> str:
    return make_token(grpc_server.home, "operator", "operator")


@pytest.fixture(scope="module")
def reference(demo_store: Path) -> dict[str, ort.InferenceSession]:
    return {
        name: ort.InferenceSession(str(demo_store / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        for name in ("mlp", "textcls")
    }


@pytest.fixture(scope="module")
def signature_models(grpc_server: Server, operator: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The strings (BYTES), vad (scalar input, no batch axis) and alltypes models, served."""
    builds = tmp_path_factory.mktemp("grpc-archives")
    folders = [write(builds / write.__name__) for write in (write_strings, write_vad, write_alltypes)]
    return push_and_deploy(grpc_server, folders, operator)


def tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    given = grpcclient.InferInput(name, list(array.shape), datatype)
    given.set_data_from_numpy(array)
    return given


def mlp_run(reference: dict, x: np.ndarray) -> np.ndarray:
    return reference["mlp"].run(None, {"input": x})[0]


# -- health, metadata, configuration, statistics -----------------------------------------------------


def test_health_rpcs_and_the_standard_health_service(grpc_server: Server, triton) -> None:
    assert triton.is_server_live() is True
    assert triton.is_server_ready() is True
    assert triton.is_model_ready("mlp") is True
    assert triton.is_model_ready("textcls", "1") is True
    assert triton.is_model_ready("resnet50") is False  # as Triton: not ready, not an error
    assert triton.is_model_ready("mlp", "9") is False
    with grpc.insecure_channel(grpc_server.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_server_and_model_metadata_equal_rest(grpc_server: Server, triton) -> None:
    metadata = triton.get_server_metadata(as_json=True)
    assert metadata == grpc_server.get("/v2")[1]
    for name in ("mlp", "textcls"):
        got, rest = triton.get_model_metadata(name), grpc_server.get(f"/v2/models/{name}")[1]
        assert (got.name, list(got.versions), got.platform) == (rest["name"], rest["versions"], rest["platform"])
        for kind in ("inputs", "outputs"):
            tensors = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in getattr(got, kind)]
            assert tensors == rest[kind]


def test_model_config_is_rests_in_tritons_message(grpc_server: Server, triton) -> None:
    config = triton.get_model_config("mlp", as_json=True)["config"]
    rest = grpc_server.get("/v2/models/mlp/config")[1]
    assert config["name"] == "mlp" and config["max_batch_size"] == rest["max_batch_size"] == 32
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": ["64"]}]  # int64 as JSON text
    queue = config["dynamic_batching"]["default_queue_policy"]
    assert queue["allow_timeout_override"] is True
    assert (
        int(queue["default_timeout_microseconds"])
        == rest["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"]
    )


def test_statistics_count_grpc_requests(triton) -> None:
    before = triton.get_inference_statistics("mlp").model_stats[0]
    x = np.zeros((2, 64), dtype=np.float32)
    for _ in range(2):
        triton.infer("mlp", [tensor("input", x, "FP32")])
    after = triton.get_inference_statistics("mlp").model_stats[0]
    assert (after.name, after.version) == ("mlp", "1")
    assert after.inference_count - before.inference_count == 4
    assert after.inference_stats.success.count - before.inference_stats.success.count == 2
    assert after.inference_stats.compute_input.count - before.inference_stats.compute_input.count == 2
    assert {"mlp", "textcls"} <= {s.name for s in triton.get_inference_statistics().model_stats}


# -- inference -----------------------------------------------------------------------------------


def test_infer_answers_equal_onnx_runtime_and_metadata_travels_both_ways(triton, stub, reference) -> None:
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    result = triton.infer(
        "mlp",
        [tensor("input", x, "FP32")],
        outputs=[grpcclient.InferRequestedOutput("probabilities")],
        request_id="grpc-1",
    )
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("grpc-1", "mlp", "1")
    np.testing.assert_allclose(result.as_numpy("probabilities"), mlp_run(reference, x), rtol=0, atol=1e-5)

    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend(x[0].tolist())
    answer, call = stub.ModelInfer.with_call(request, metadata=(("x-request-id", "trace-7"),), timeout=10)
    sent = dict(call.trailing_metadata())
    assert sent["x-request-id"] == "trace-7" and sent["x-model-version"] == "1" and sent["x-model-slot"] == "blue"
    got = np.frombuffer(answer.raw_output_contents[0], dtype="<f4").reshape(1, 10)
    np.testing.assert_allclose(got, mlp_run(reference, x[:1]), rtol=0, atol=1e-5)


def test_textcls_with_a_padding_mask_and_a_timeout_parameter(triton, reference) -> None:
    rng = np.random.default_rng(3)
    ids, mask = np.zeros((2, 12), dtype=np.int64), np.zeros((2, 12), dtype=np.int64)
    ids[0], mask[0] = rng.integers(1, 30000, size=12), 1
    ids[1, :7], mask[1, :7] = rng.integers(1, 30000, size=7), 1
    inputs = [tensor("input_ids", ids, "INT64"), tensor("attention_mask", mask, "INT64")]
    result = triton.infer("textcls", inputs, timeout=5_000_000, client_timeout=10)
    expected = reference["textcls"].run(None, {"input_ids": ids, "attention_mask": mask})[0]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=0, atol=1e-5)


def test_bytes_and_a_scalar_input(triton, stub, signature_models) -> None:
    words = np.array(["yes", "héllo", "", "no"], dtype=object)
    result = triton.infer("strings", [tensor("text", words, "BYTES")])
    expected = strings_reference(words)
    assert [m.decode() for m in result.as_numpy("marked").tolist()] == expected["marked"].tolist()
    np.testing.assert_array_equal(result.as_numpy("is_yes"), expected["is_yes"])
    np.testing.assert_array_equal(result.as_numpy("ids"), expected["ids"])
    # Typed bytes_contents too; and a BYTES element that is not UTF-8 is refused as REST refuses it.
    request = service_pb2.ModelInferRequest(model_name="strings")
    request.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"yes", b"no"])
    answer = stub.ModelInfer(request, timeout=10)
    assert answer.raw_output_contents[0] == b"".join(len(w).to_bytes(4, "little") + w for w in (b"YES!", b"no"))
    request.inputs[0].contents.bytes_contents[1] = b"\xff"
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "input 'text': BYTES element 1 is not UTF-8 text"

    rng = np.random.default_rng(6)
    audio, state = rng.standard_normal((2, 32)).astype(np.float32), rng.standard_normal((2, 2, 8)).astype(np.float32)
    sr = np.array(16000, dtype=np.int64)
    inputs = [tensor("input", audio, "FP32"), tensor("state", state, "FP32"), tensor("sr", sr, "INT64")]
    vad = triton.infer("vad", inputs)
    assert vad.as_numpy("count").shape == () and vad.as_numpy("count").item() == 64
    np.testing.assert_allclose(vad.as_numpy("stateN"), vad_reference(audio, state, sr)["stateN"], atol=1e-5)


def test_every_datatype_in_one_request(triton, signature_models) -> None:
    """alltypes answers each input as it came (Identity): every datatype REST takes, raw both ways."""
    samples = {datatype: sample_of(datatype, batch=3, seed=len(datatype)) for datatype in ONNX_TYPES}
    result = triton.infer("alltypes", [tensor(f"in_{d}", sample, d) for d, sample in samples.items()])
    for datatype, sample in samples.items():
        got = result.as_numpy(f"out_{datatype}")
        if datatype == "BYTES":
            assert [v.decode() for v in got.ravel()] == sample.ravel().tolist()
        else:
            assert got.dtype == sample.dtype, datatype
            np.testing.assert_array_equal(got, sample)


# -- refusals: REST's messages, gRPC's codes ---------------------------------------------------------


def test_bad_requests_get_status_codes_with_rests_messages(grpc_server: Server, triton, stub) -> None:
    x = np.zeros((1, 64), dtype=np.float32)
    with pytest.raises(InferenceServerException) as unknown:
        triton.infer("resnet50", [tensor("input", x, "FP32")])
    assert unknown.value.status() == "StatusCode.NOT_FOUND" and "resnet50" in unknown.value.message()
    rest = grpc_server.post("/v2/models/mlp/infer", {"inputs": [{"name": "input", "shape": [1, 63], "datatype": "FP32", "data": [0.0] * 63}]})  # fmt: skip
    with pytest.raises(InferenceServerException) as shape:
        triton.infer("mlp", [tensor("input", np.zeros((1, 63), dtype=np.float32), "FP32")])
    assert shape.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert shape.value.message() == rest[1]["error"]
    with pytest.raises(InferenceServerException) as metadata:
        triton.get_model_metadata("resnet50")
    assert metadata.value.status() == "StatusCode.NOT_FOUND"

    def refused(request: service_pb2.ModelInferRequest) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=10)
        return info.value

    wrong_size = service_pb2.ModelInferRequest(model_name="mlp", raw_input_contents=[b"\0" * 12])
    wrong_size.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    error = refused(wrong_size)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "input 'input': raw_input_contents[0] size 12 bytes, shape [1, 64] of FP32 needs 256"
    no_inputs = service_pb2.ModelInferRequest(model_name="mlp")
    assert refused(no_inputs).details() == "'inputs' must be a non-empty list"
    bad_type = service_pb2.ModelInferRequest(model_name="mlp")
    bad_type.inputs.add(name="input", datatype="FLOAT", shape=[1, 64])
    assert refused(bad_type).details().startswith("input 'input': unsupported datatype 'FLOAT'")
    unknown_output = service_pb2.ModelInferRequest(model_name="mlp", raw_input_contents=[x.tobytes()])
    unknown_output.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    unknown_output.outputs.add(name="nope")
    assert refused(unknown_output).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_message_over_the_size_limit_is_refused_by_grpc(triton) -> None:
    big = np.zeros((16 * 1024 * 1024 // 256 + 1, 64), dtype=np.float32)  # just over FLIGHTDECK_MAX_REQUEST_BYTES
    with pytest.raises(InferenceServerException) as info:
        triton.infer("mlp", [tensor("input", big, "FP32")])
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_a_full_queue_is_unavailable_with_retry_after(grpc_server: Server) -> None:
    """96 calls of 8 long texts at once (under the 100 streams a connection may hold) against textcls's
    128-sample queue: the excess is refused at once, as REST's 429, never left to time out."""
    ids = np.ones((8, 256), dtype=np.int64)
    request = service_pb2.ModelInferRequest(model_name="textcls", raw_input_contents=[ids.tobytes(), ids.tobytes()])
    request.inputs.add(name="input_ids", datatype="INT64", shape=[8, 256])
    request.inputs.add(name="attention_mask", datatype="INT64", shape=[8, 256])

    async def run() -> list[tuple[grpc.StatusCode, str, dict]]:
        async with grpc.aio.insecure_channel(grpc_server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def one() -> tuple[grpc.StatusCode, str, dict]:
                call = stub.ModelInfer(request, timeout=120)  # NOTE: the admitted 128 samples, on a busy machine
                try:
                    await call
                except grpc.aio.AioRpcError:
                    pass
                return await call.code(), await call.details(), dict(await call.trailing_metadata() or ())

            return await asyncio.gather(*(one() for _ in range(96)))

    outcomes = asyncio.run(run())
    refused = [(details, trailers) for code, details, trailers in outcomes if code == grpc.StatusCode.UNAVAILABLE]
    assert refused and {code for code, _, _ in outcomes} <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    details, trailers = refused[0]
    assert "every queue of 'textcls' is full" in details
    assert int(trailers["retry-after"]) >= 1 and trailers["x-request-id"]


def test_the_clients_deadline_becomes_the_requests(triton) -> None:
    """A deadline too short for the request to run: DEADLINE_EXCEEDED, and the server counts it as a timeout."""
    ids = np.ones((8, 512), dtype=np.int64)
    inputs = [tensor("input_ids", ids, "INT64"), tensor("attention_mask", ids, "INT64")]
    with pytest.raises(InferenceServerException) as info:
        triton.infer("textcls", inputs, client_timeout=0.001)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"


# -- the model repository, auth ------------------------------------------------------------------------


def test_repository_rpcs_need_an_operator_token_and_are_audited(grpc_server: Server, triton, operator) -> None:
    with pytest.raises(InferenceServerException) as anonymous:
        triton.get_model_repository_index()
    assert anonymous.value.status() == "StatusCode.UNAUTHENTICATED"
    viewer = make_token(grpc_server.home, "viewer", "viewer")
    with pytest.raises(InferenceServerException) as denied:
        triton.unload_model("mlp", headers={"authorization": f"Bearer {viewer}"})
    assert denied.value.status() == "StatusCode.PERMISSION_DENIED"
    as_operator = {"authorization": f"Bearer {operator}"}
    index = triton.get_model_repository_index(headers=as_operator, as_json=True)["models"]
    assert {"name": "mlp", "version": "1", "state": "READY"} in index
    triton.unload_model("textcls", headers=as_operator)
    assert triton.is_model_ready("textcls") is False
    triton.load_model("textcls", headers=as_operator)
    assert triton.is_model_ready("textcls") is True
    with pytest.raises(InferenceServerException) as override:
        triton.load_model("textcls", headers=as_operator, config='{"max_batch_size": 2}')
    assert override.value.status() == "StatusCode.INVALID_ARGUMENT" and "not supported" in override.value.message()
    events = audit_events(grpc_server.home)
    assert ("model.undeploy", "operator", "ok", "127.0.0.1") in events
    assert ("model.deploy", "operator", "ok", "127.0.0.1") in events
    assert ("model.undeploy", "viewer", "denied", "127.0.0.1") in events


def audit_events(home: Path) -> list[tuple[str, str, str, str | None]]:
    """The audit trail in the server's database: (action, actor, outcome, address)."""
    from controlplane.auth.audit import list_events
    from controlplane.db import make_engine, session_factory

    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    try:
        with session_factory(engine)() as session:
            return [(e.action, e.actor, e.outcome, e.address) for e in list_events(session, limit=50)]
    finally:
        engine.dispose()


# -- concurrency, the async client, drain --------------------------------------------------------------


def test_mixed_shapes_concurrently_through_the_async_client(grpc_server: Server, reference) -> None:
    rng = np.random.default_rng(9)
    batches = [
        rng.standard_normal((int(n), 64)).astype(np.float32) for n in rng.integers(1, 5, size=32)
    ]  # at most 128 samples: the queue

    async def run() -> list[np.ndarray]:
        async with aioclient.InferenceServerClient(url=grpc_server.grpc) as client:

            async def one(x: np.ndarray) -> np.ndarray:
                given = aioclient.InferInput("input", list(x.shape), "FP32")
                given.set_data_from_numpy(x)
                return (await client.infer("mlp", [given])).as_numpy("probabilities")

            return await asyncio.gather(*(one(x) for x in batches))

    for x, got in zip(batches, asyncio.run(run())):
        np.testing.assert_allclose(got, mlp_run(reference, x), rtol=0, atol=1e-5)


def test_inference_auth_then_sigterm_finishes_every_grpc_call_in_flight(tmp_path: Path, template_home: Path) -> None:
    """With FLIGHTDECK_INFERENCE_AUTH a call needs a bearer token; SIGTERM lets every call in flight finish."""
    home = copy_home(template_home, tmp_path / "home")
    port = free_port()
    token = make_token(home, "caller", "viewer")
    server = start_server(
        home,
        {
            "FLIGHTDECK_GRPC_PORT": str(port),
            "FLIGHTDECK_INFERENCE_AUTH": "true",
            "FLIGHTDECK_LOAD_MODELS": "textcls",
            "FLIGHTDECK_MAX_BATCH_SIZE": "1",
            "FLIGHTDECK_DRAIN_GRACE_S": "60",
            "FLIGHTDECK_SCHEDULER": "false",
        },
    )
    results: list[str] = []
    lock = threading.Lock()
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    ids = np.ones((1, 512), dtype=np.int64)
    for headers in (None, {"authorization": "Bearer fd_wrong"}):
        with pytest.raises(InferenceServerException) as refused:
            client.infer("textcls", [tensor("input_ids", ids, "INT64")], headers=headers)
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "an API token is required" in refused.value.message()
    assert client.is_server_ready() is True  # the probes stay open, as REST's
    with pytest.raises(InferenceServerException) as metadata:
        client.get_model_metadata("textcls")
    assert metadata.value.status() == "StatusCode.UNAUTHENTICATED"
    bearer = {"authorization": f"Bearer {token}"}
    assert client.get_model_metadata("textcls", headers=bearer).name == "textcls"

    def done(result, error) -> None:
        with lock:
            results.append("ok" if error is None and result.as_numpy("logits").shape == (1, 3) else str(error))

    try:
        for _ in range(24):
            inputs = [tensor("input_ids", ids, "INT64"), tensor("attention_mask", ids, "INT64")]
            client.async_infer("textcls", inputs, done, headers=bearer)

        # Synchronise on the server's own account of its queue: the signal goes out right after one reading in
        # which every call is admitted (waiting, answered, or one of the two the engine holds: the batch running
        # and the next one formed) and 4 or more still wait, never after a second reading that the drain may
        # race. Answers are counted before the queue is read, so a call answered in between is not counted twice.
        def admitted() -> float | None:
            answered = len(results)
            depth = _queued(server.metrics())
            return depth if depth >= 4 and depth + answered >= 22 else None

        queued = wait_until(admitted, 30, "every call admitted with 4 or more waiting")
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: len(results) == 24, 60, "every call to be answered")
        assert server.process.wait(60) == 0
    finally:
        client.close()
        server.stop(signal.SIGKILL)
    assert queued >= 4
    assert results == ["ok"] * 24, results
    assert "all requests finished" in server.output()


def _queued(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("flightdeck_queue_depth{") and 'model="textcls"' in line
    )


def test_a_rollout_in_progress_is_served_over_grpc_without_a_failed_call(grpc_server: Server, operator) -> None:
    """Blue-green from mlp 1 to 2 (then back) under gRPC traffic from two clients: every call answered."""
    from bench.rollout import call

    port = int(grpc_server.url.rsplit(":", 1)[1])
    seen: list[tuple[str, str]] = []  # (outcome, version)
    stop = threading.Event()
    x = np.zeros((1, 64), dtype=np.float32)

    def traffic() -> None:
        client = grpcclient.InferenceServerClient(url=grpc_server.grpc)
        try:
            while not stop.is_set():
                try:
                    seen.append(("ok", client.infer("mlp", [tensor("input", x, "FP32")]).get_response().model_version))
                except InferenceServerException as exc:
                    seen.append((str(exc.status()), ""))
        finally:
            client.close()

    def serving(version: str) -> bool:
        start = len(seen)
        wait_until(lambda: len(seen) > start + 20, 30, "more calls")
        return all(v == version for _, v in seen[start + 10 :])

    threads = [threading.Thread(target=traffic) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        rollout = call(port, "POST", "/api/models/mlp/deploy", operator, {"version": "2", "strategy": "bluegreen"})
        while rollout["state"] != "succeeded":
            assert rollout["state"] in ("loading", "progressing"), rollout
            rollout = call(port, "GET", f"/api/rollouts/{rollout['id']}", operator)
        wait_until(lambda: serving("2"), 30, "version 2 to serve every call")
        assert call(port, "POST", "/api/models/mlp/rollback", operator)["version"] == "1"
        wait_until(lambda: serving("1"), 30, "version 1 to serve every call again")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert {outcome for outcome, _ in seen} == {"ok"}, [s for s in seen if s[0] != "ok"][:5]
    assert {version for _, version in seen} == {"1", "2"}


def test_a_second_server_on_a_taken_grpc_port_refuses_to_start(grpc_server: Server, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="FLIGHTDECK_GRPC_PORT .* is in use"):
        start_server(tmp_path / "home", {"FLIGHTDECK_GRPC_PORT": grpc_server.grpc.rsplit(":", 1)[1]}, ready_timeout=30)
    assert time.monotonic() - started < 30
