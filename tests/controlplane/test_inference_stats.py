"""Triton's compute_input and compute_output: the request's decode and the response's encode, measured."""

from __future__ import annotations

import pytest

from tests.controlplane.test_inference_api import MLP, TEXT, binary_body, mlp_array, mlp_body, mlp_stats, post


@pytest.fixture(autouse=True)
def quick_warmup(app_config: dict) -> None:
    """Warm up at the shortest bucket only, as test_inference_api does."""
    app_config["warmup_max_sequence"] = 16


def codec(entry: dict) -> tuple[int, int, int, int]:
    stats = entry["inference_stats"]
    return (
        stats["compute_input"]["count"],
        stats["compute_input"]["ns"],
        stats["compute_output"]["count"],
        stats["compute_output"]["ns"],
    )


def test_every_successful_request_adds_its_decode_and_encode_time(client) -> None:
    assert codec(mlp_stats(client)) == (0, 0, 0, 0)  # warm-up is not traffic
    for seed in range(3):
        assert post(client, f"{MLP}/infer", mlp_body(2, seed=seed)).status_code == 200
    body, headers = binary_body([("input", "FP32", mlp_array(4, seed=9))], outputs=[{"name": "probabilities"}])
    assert post(client, f"{MLP}/infer", body, headers).status_code == 200
    after_good = codec(mlp_stats(client))
    decoded, decode_ns, encoded, encode_ns = after_good
    assert decoded == encoded == 4
    # Real time was spent: at least a microsecond per request, far less than a second in all.
    assert 4_000 <= decode_ns < 10**9 and 4_000 <= encode_ns < 10**9

    # A request refused before it ran is not a successful request: nothing is added.
    wrong_shape = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    assert post(client, f"{MLP}/infer", wrong_shape).status_code == 400
    entry = mlp_stats(client)
    assert codec(entry) == after_good
    assert entry["inference_stats"]["success"]["count"] == 4
    # Batch entries are counted per batch, where codec time does not exist: they carry compute_infer only.
    assert all(set(e) == {"batch_size", "compute_infer"} for e in entry["batch_stats"])

    (text,) = client.get(f"{TEXT}/stats").get_json()["model_stats"]
    assert codec(text) == (0, 0, 0, 0)  # counted in the version that ran the request only
