"""The engine over real ONNX Runtime sessions: slots, routing, providers, warm-up, padding, drain."""

from __future__ import annotations

import os
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from serving.engine import Engine
from serving.errors import InvalidInput, ModelNotFound, Overloaded, Unavailable
from serving.runtime import CPU, CUDA, requested_providers
from serving.settings import BatchingSettings, RuntimeSettings


def mlp_input(seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((batch, 64)).astype(np.float32)}


@pytest.fixture
def engine():
    eng = Engine(rng=random.Random(7))
    yield eng
    eng.drain(10)


def test_nothing_loaded_is_not_ready_and_unknown_models_are_404(engine: Engine) -> None:
    assert not engine.ready()
    with pytest.raises(ModelNotFound, match="unknown model 'mlp'"):
        engine.infer("mlp", mlp_input())


def test_load_reports_the_provider_the_session_really_got(engine: Engine, demo_store: Path) -> None:
    loaded = engine.load(demo_store / "mlp" / "1")
    assert loaded.provider == loaded.session.session.get_providers()[0]
    if CUDA not in ort.get_available_providers():
        assert loaded.provider == CPU
    assert loaded.warmup_s > 0
    assert loaded.batcher.stats.execution_count == 0  # warm-up is not traffic
    assert engine.ready() and engine.model_ready("mlp") and engine.model_ready("mlp", "1")
    assert not engine.model_ready("mlp", "2")


@pytest.mark.skipif(CUDA in ort.get_available_providers(), reason="checks the fallback on a machine without CUDA")
def test_asking_for_cuda_without_a_gpu_falls_back_to_cpu_and_says_so(demo_store: Path, caplog) -> None:
    settings = RuntimeSettings(device="cuda")
    assert requested_providers(settings) == [CPU]
    assert any("no CUDA provider" in r.getMessage() for r in caplog.records)
    engine = Engine(runtime=settings)
    loaded = engine.load(demo_store / "mlp" / "1")
    assert loaded.provider == CPU
    assert engine.infer("mlp", mlp_input()).outputs["probabilities"].shape == (1, 10)
    engine.drain(5)


def test_results_match_a_plain_onnx_runtime_session(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1")
    reference = ort.InferenceSession(str(demo_store / "mlp" / "1" / "model.onnx"), providers=[CPU])
    inputs = mlp_input(3, batch=4)
    routed = engine.infer("mlp", inputs)
    np.testing.assert_allclose(routed.outputs["probabilities"], reference.run(None, inputs)[0], rtol=1e-5, atol=1e-6)
    assert (routed.version, routed.slot) == ("1", "blue")


def test_weights_route_traffic_between_blue_and_green(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1", "blue")
    engine.load(demo_store / "mlp" / "2", "green")
    assert engine.weights("mlp") == {"blue": 100, "green": 0}
    assert {engine.infer("mlp", mlp_input(i)).version for i in range(20)} == {"1"}
    engine.set_weights("mlp", {"blue": 0, "green": 100})
    assert {engine.infer("mlp", mlp_input(i)).slot for i in range(20)} == {"green"}
    engine.set_weights("mlp", {"blue": 75, "green": 25})
    slots = Counter(engine.resolve("mlp").slot for _ in range(4000))
    assert 0.70 < slots["blue"] / 4000 < 0.80


def test_sticky_route_key_keeps_a_caller_on_one_slot(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1", "blue")
    engine.load(demo_store / "mlp" / "2", "green")
    engine.set_weights("mlp", {"blue": 50, "green": 50})
    for key in ("alice", "bob", "carol", "dave"):
        assert len({engine.resolve("mlp", route_key=key).slot for _ in range(50)}) == 1
    assert len({engine.resolve("mlp", route_key=f"user-{i}").slot for i in range(100)}) == 2


def test_explicit_version_bypasses_the_weights(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1", "blue")
    engine.load(demo_store / "mlp" / "2", "green")
    routed = engine.infer("mlp", mlp_input(), version="2")
    assert (routed.version, routed.slot) == ("2", "green")
    v1 = engine.infer("mlp", mlp_input(), version="1").outputs["probabilities"]
    assert not np.allclose(v1, routed.outputs["probabilities"])  # really a different model
    with pytest.raises(ModelNotFound, match="no version 9"):
        engine.infer("mlp", mlp_input(), version="9")


def test_weights_must_send_traffic_to_a_loaded_slot(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1", "blue")
    with pytest.raises(ValueError, match="no traffic to a loaded slot"):
        engine.set_weights("mlp", {"blue": 0, "green": 100})
    with pytest.raises(ValueError):
        engine.set_weights("mlp", {"blue": -1})
    with pytest.raises(ValueError):
        engine.load(demo_store / "mlp" / "1", "purple")
    assert engine.weights("mlp") == {"blue": 100, "green": 0}


def test_unloading_the_live_slot_leaves_the_other_serving(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1", "blue")
    engine.load(demo_store / "mlp" / "2", "green")
    engine.set_weights("mlp", {"blue": 50, "green": 50})
    engine.unload("mlp", "blue")
    assert {engine.infer("mlp", mlp_input(i)).slot for i in range(10)} == {"green"}
    with pytest.raises(ModelNotFound):
        engine.unload("mlp", "blue")


def test_invalid_input_is_refused_before_the_queue(engine: Engine, demo_store: Path) -> None:
    loaded = engine.load(demo_store / "mlp" / "1")
    with pytest.raises(InvalidInput, match="datatype FP64"):
        engine.infer("mlp", {"input": np.zeros((1, 64))})
    with pytest.raises(InvalidInput, match="over the limit of 32"):
        engine.infer("mlp", mlp_input(batch=33))
    assert loaded.batcher.stats.execution_count == 0
    assert engine.infer("mlp", mlp_input()).outputs["probabilities"].shape == (1, 10)


def test_client_timeout_can_only_shorten_the_default(demo_store: Path) -> None:
    engine = Engine(batching=BatchingSettings(default_timeout_ms=50))
    engine.load(demo_store / "mlp" / "1")
    loaded = engine.loaded("mlp")[0]
    seen = []
    original = loaded.batcher.submit

    def spy(tensors, batch, seq_len, timeout_s, **options):
        seen.append(timeout_s)
        return original(tensors, batch, seq_len, timeout_s, **options)

    loaded.batcher.submit = spy  # observe the deadline the engine hands the batcher
    engine.infer("mlp", mlp_input(), timeout_s=60.0)
    engine.infer("mlp", mlp_input(), timeout_s=0.01)
    assert seen == [0.05, 0.01]
    engine.drain(5)


def test_concurrent_text_requests_are_batched_and_padding_does_not_change_answers(
    engine: Engine, demo_store: Path
) -> None:
    engine.load(demo_store / "textcls" / "1")
    rng = np.random.default_rng(1)
    requests = []
    for length in [5, 9, 14, 16, 23, 30, 31, 32] * 3:
        ids = rng.integers(1, 30000, size=(1, length), dtype=np.int64)
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    solo = [engine.infer("textcls", r).outputs["logits"] for r in requests]
    with ThreadPoolExecutor(16) as pool:
        routed = list(pool.map(lambda r: engine.infer("textcls", r), requests))
    assert max(r.batch_size for r in routed) > 1  # concurrency really formed batches
    for alone, together in zip(solo, routed):
        np.testing.assert_allclose(together.outputs["logits"], alone, atol=1e-4)
    stats = engine.loaded("textcls")[0].batcher.stats
    assert stats.padded_tokens >= stats.real_tokens > 0


def test_drain_refuses_new_work_and_turns_unready(engine: Engine, demo_store: Path) -> None:
    engine.load(demo_store / "mlp" / "1")
    engine.begin_drain()
    assert not engine.ready() and not engine.model_ready("mlp")
    with pytest.raises(Unavailable, match="draining"):
        engine.infer("mlp", mlp_input())
    assert engine.drain(5)


def test_auto_parallelism_gives_each_cpu_core_its_own_executor() -> None:
    from serving.settings import parallelism

    cores = os.cpu_count() or 1
    assert parallelism(RuntimeSettings(), BatchingSettings(), on_gpu=False) == (
        min(cores, 4),
        max(1, cores // min(cores, 4)),
    )
    assert parallelism(RuntimeSettings(intra_op_threads=3), BatchingSettings(instances=1), on_gpu=False) == (1, 3)
    assert parallelism(RuntimeSettings(), BatchingSettings(), on_gpu=True) == (2, 0)


def test_admission_check_refuses_before_any_work_when_every_queue_is_full(demo_store: Path) -> None:
    from tests.fakes import Gated

    engine = Engine(batching=BatchingSettings(max_queue_size=2, instances=1))
    loaded = engine.load(demo_store / "mlp" / "1")
    gate = Gated(lambda inputs: loaded.session.run(inputs))
    loaded.batcher._run = gate  # hold the executor inside the model so the queue can fill
    engine.check_admission("mlp")  # empty: admitted
    first = loaded.batcher.submit(mlp_input(), 1, 0, 30)
    assert gate.started.wait(5)
    queued = [loaded.batcher.submit(mlp_input(i), 1, 0, 30) for i in range(2)]
    with pytest.raises(Overloaded, match="every queue of 'mlp' is full") as refused:
        engine.check_admission("mlp")
    assert refused.value.status == 429
    engine.check_admission("unknown-model")  # unknown models are left to the 404 path
    gate.gate.set()
    for pending in [first, *queued]:
        assert loaded.batcher.result(pending)["probabilities"].shape == (1, 10)
    engine.drain(5)
