"""Bad requests mixed into concurrent good traffic on the three public models: every good request succeeds."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.public_models.catalogue import run_alone
from tests.public_models.conftest import Deployed, Fleet
from tests.public_models.inputs import (
    magika_requests,
    ocr_image,
    ocr_requests,
    reference,
    vad_audio,
    vad_chunk,
    vad_zero_state,
)
from tests.public_models.oip import Answer, assert_matches, infer_json, infer_triton, run_concurrently, tensor_json

pytestmark = pytest.mark.slow

MODELS = ("ocr-det", "silero-vad", "magika")


def bad_requests(url: str) -> dict[str, Callable[[], Answer]]:
    """Requests a careless or hostile client sends, each of which must get a 400 of its own."""
    row = magika_requests(1)[0]["bytes"]
    chunk = vad_chunk(vad_audio(99, 16000, 1, 2), 0, 16000, vad_zero_state(1))
    return {
        # Refused by the signature check, before any batch is formed.
        "magika FP32 features": functools.partial(infer_json, url, "magika", {"bytes": row.astype(np.float32)}),
        "magika rank 1": functools.partial(infer_json, url, "magika", {"bytes": row[0]}),
        "magika 2047 columns": functools.partial(infer_triton, url, "magika", {"bytes": row[:, :2047].copy()}),
        "magika unknown input": functools.partial(infer_json, url, "magika", {"tokens": row}),
        "magika data shorter than shape": functools.partial(
            infer_json, url, "magika", [tensor_json("bytes", row[:, :100], shape=[1, 2048])]
        ),
        "ocr four channels": functools.partial(
            infer_triton, url, "ocr-det", {"x": ocr_image(1, 64, 64)[:, [0, 1, 2, 0]]}
        ),
        "vad sr as INT32": functools.partial(infer_json, url, "silero-vad", {**chunk, "sr": np.array(16000, np.int32)}),
        "vad sr as a vector": functools.partial(
            infer_json, url, "silero-vad", {**chunk, "sr": np.array([16000], np.int64)}
        ),
        "vad state too narrow": functools.partial(
            infer_triton, url, "silero-vad", {**chunk, "state": np.zeros((2, 1, 64), np.float32)}
        ),
        # Valid by the signature; ONNX Runtime itself refuses them inside the graph.
        "vad 1024-sample chunk": functools.partial(
            infer_json, url, "silero-vad", {**chunk, "input": vad_audio(98, 16000, 1, 2)}
        ),
        # The detector's feature pyramid needs sides that are multiples of 32; two alike may share a batch.
        "ocr 40x72 image a": functools.partial(infer_json, url, "ocr-det", {"x": ocr_image(2, 40, 72)}),
        "ocr 40x72 image b": functools.partial(infer_triton, url, "ocr-det", {"x": ocr_image(3, 40, 72)}),
    }


def outcomes(fleet: Fleet) -> dict[str, float]:
    """Requests to the public models by outcome, summed over every worker (the Prometheus endpoint merges them)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(fleet.server.metrics()):
        for sample in family.samples:
            if sample.name == "flightdeck_inference_requests_total" and sample.labels.get("model") in MODELS:
                outcome = sample.labels["outcome"]
                totals[outcome] = totals.get(outcome, 0.0) + sample.value
    return totals


def test_bad_requests_among_concurrent_good_ones_fail_alone_with_400(
    fleet: Fleet, ocr_detection: Deployed, silero_vad: Deployed, magika: Deployed
) -> None:
    good: list[tuple[str, str, dict, Callable]] = []
    for i, r in enumerate(ocr_requests(24)):
        good.append(("ocr", "ocr-det", r, infer_triton if i % 2 else infer_json))
    for i, r in enumerate(magika_requests(32)):
        good.append(("magika", "magika", r, infer_triton if i % 2 else infer_json))
    for seed in range(16):
        rate = 16000 if seed % 2 else 8000
        chunk = vad_chunk(vad_audio(seed + 500, rate, 1, 1), 0, rate, vad_zero_state(1))
        good.append(("vad", "silero-vad", chunk, infer_triton if seed % 2 else infer_json))
    expected = [run_alone(reference(kind), inputs) for kind, _, inputs, _ in good]
    bad = bad_requests(fleet.url)
    before = outcomes(fleet)

    # Interleave: every fourth call is a bad one, so bad requests arrive while good ones queue beside them.
    good_calls = [functools.partial(send, fleet.url, model, inputs) for _, model, inputs, send in good]
    calls: list[Callable[[], Answer]] = []
    names = iter(bad)
    for i, call in enumerate(good_calls):
        calls.append(call)
        if i % 4 == 3 and (name := next(names, None)):
            calls.append(bad[name])
    calls.extend(bad[name] for name in names)
    answers = dict(zip(calls, run_concurrently(calls, threads=32)))

    for (kind, _model, inputs, _), call, want in zip(good, good_calls, expected):
        shapes = {n: list(a.shape) for n, a in inputs.items()}
        assert_matches(answers[call], want, f"good {kind} request {shapes}")
    for name, call in bad.items():
        answer = answers[call]
        assert answer.status == 400, f"{name}: {answer.status} {answer.error}"
        assert answer.error, f"{name}: a 400 must say why"
    # Client mistakes are not the server's: nothing here may count toward the error-rate alert, and the
    # three that ONNX Runtime refused inside the graph are counted as client errors.
    # Each worker writes its counts at most metricsflush.FLUSH_INTERVAL_S after the request: wait for all of them.
    deadline = time.monotonic() + 30
    while True:
        after = outcomes(fleet)
        done = (
            after.get("success", 0) - before.get("success", 0),
            after.get("client_error", 0) - before.get("client_error", 0),
        )
        if done[0] >= len(good) and done[1] >= 3:
            break
        assert time.monotonic() < deadline, (before, after)
    assert after.get("error", 0) == before.get("error", 0) == 0, after
    assert after.get("client_error", 0) - before.get("client_error", 0) >= 3, (before, after)
    assert after["success"] - before["success"] == len(good), (before, after)
