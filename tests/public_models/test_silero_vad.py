"""Silero VAD: a stateful audio model with a scalar sample-rate input, served unbatched (max_batch_size 0)."""

from __future__ import annotations

import pytest

from tests.public_models.catalogue import run_alone
from tests.public_models.conftest import Deployed, Fleet
from tests.public_models.inputs import CHUNK, reference, vad_audio, vad_chunk, vad_zero_state
from tests.public_models.oip import Answer, assert_matches, describe, infer_json, infer_triton, run_concurrently

pytestmark = pytest.mark.slow

CHUNKS = 4
# NOTE: each request runs alone, exactly as plain ONNX Runtime runs it, so the answers may be held tight.
ATOL, RTOL = 1e-5, 1e-4


def test_the_model_is_published_with_its_own_shapes_and_no_batch_axis(fleet: Fleet, silero_vad: Deployed) -> None:
    metadata, config = describe(fleet.url, "silero-vad")
    assert metadata["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "state", "datatype": "FP32", "shape": [2, -1, 128]},
        {"name": "sr", "datatype": "INT64", "shape": []},
    ]
    assert [(o["name"], o["datatype"]) for o in metadata["outputs"]] == [("output", "FP32"), ("stateN", "FP32")]
    assert config["max_batch_size"] == 0, config
    assert silero_vad.manifest["batching"]["max_batch_size"] == 0
    assert silero_vad.pushed["golden"] == {"samples": 2, "passed": True}


def stream_through_server(url: str, seed: int, rate: int, batch: int) -> list[tuple[Answer, dict]]:
    """Send one client's audio chunk by chunk, feeding the server's state back; return each answer and its inputs."""
    audio, state, seen = vad_audio(seed, rate, batch, CHUNKS), vad_zero_state(batch), []
    for index in range(CHUNKS):
        inputs = vad_chunk(audio, index, rate, state)
        answer = (infer_triton if (seed + index) % 2 else infer_json)(url, "silero-vad", inputs)
        seen.append((answer, inputs))
        if answer.status != 200:
            break
        state = answer.outputs["stateN"]
    return seen


def test_32_concurrent_audio_streams_match_plain_onnx_runtime(fleet: Fleet, silero_vad: Deployed) -> None:
    # 16 kHz and 8 kHz streams (the graph branches on the scalar), one or two channels per request.
    clients = [(seed, 16000 if seed % 2 else 8000, 2 if seed % 3 == 0 else 1) for seed in range(32)]
    streams = run_concurrently([lambda c=c: stream_through_server(fleet.url, *c) for c in clients], threads=32)
    session = reference("vad")
    for (seed, rate, batch), stream in zip(clients, streams):
        assert len(stream) == CHUNKS, f"stream {seed} stopped: {stream[-1][0].status} {stream[-1][0].error}"
        state = vad_zero_state(batch)
        for index, (answer, sent) in enumerate(stream):
            # The reference runs the same stream alone, carrying its own state from chunk to chunk.
            inputs = vad_chunk(vad_audio(seed, rate, batch, CHUNKS), index, rate, state)
            assert sent["input"].shape == (batch, CHUNK[rate])
            want = run_alone(session, inputs)
            assert_matches(answer, want, f"stream {seed} ({rate} Hz, {batch} ch) chunk {index}", ATOL, RTOL)
            assert want["output"].shape == (batch, 1) and want["stateN"].shape == (2, batch, 128)
            state = want["stateN"]
