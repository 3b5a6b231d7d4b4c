"""Which inputs are summarised and how, the shared bins, the bounds, and the batcher's sampling."""

from __future__ import annotations

import numpy as np

from serving import inputstats
from serving.engine import Engine
from serving.settings import BatchingSettings, RuntimeSettings


def test_columns_of_narrow_inputs_and_the_mean_of_wide_ones_are_features() -> None:
    tensors = {
        "tabular": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32),  # [batch, 3]: a feature per column
        "image": np.arange(2 * 3 * 4 * 4, dtype=np.float16).reshape(2, 3, 4, 4),  # wide: the sample's mean
        "tokens": np.full((2, 2048), 256, dtype=np.int32),  # int32: summed in float64, no overflow
        "names": np.array([b"a", b"b"], dtype=object),  # BYTES: never summarised
        "rate": np.array([16000, 8000], dtype=np.int64),  # one value per sample: the feature is the input
    }
    found = dict(inputstats.features_of(tensors, 2))
    assert found["tabular[0]"] == [1.0, 4.0] and found["tabular[2]"] == [3.0, 6.0]
    assert found["image"] == [23.5, 71.5] and found["tokens"] == [256.0, 256.0] and found["rate"] == [16000, 8000]
    assert found["tokens.std"] == [0.0, 0.0] and abs(found["image.std"][0] - np.arange(48).std()) < 1e-9
    assert "names" not in found and len(found) == 8  # 3 columns, image and tokens with their spread, rate
    scalar = {"sr": np.array(16000, dtype=np.int64), "x": np.ones((3, 2), dtype=np.float32)}  # no batch axis: skipped
    assert [name for name, _ in inputstats.features_of(scalar, 3)] == ["x[0]", "x[1]"]
    wide = {f"x{i}": np.zeros((1, 8), dtype=np.float32) for i in range(3)}  # 24 columns: only the first 8 kept
    assert [name for name, _ in inputstats.features_of(wide, 1)] == [f"x0[{i}]" for i in range(8)]


def test_bins_are_fixed_signed_and_log_spaced_and_bounded_per_feature() -> None:
    assert [inputstats.bin_of(v) for v in (1.0, 1.18, 1.2, 2.0, -1.0, 0.0, float("nan"), float("inf"))] == [
        "p0", "p0", "p1", "p4", "n0", "0", "nan", "pinf",
    ]  # fmt: skip
    low, high = inputstats.bin_range("p1")
    assert low <= 1.2 < high and inputstats.bin_range("n0") == (-(2**0.25), -1.0)
    summaries: dict = {}
    inputstats.add_values(summaries, [("x", [float(2**i) for i in range(200)])])
    assert len(summaries["x"]["bins"]) == inputstats.MAX_BINS + 1 and summaries["x"]["bins"][inputstats.OTHER] > 0
    inputstats.add_values(summaries, [(f"f{i}", [1.0]) for i in range(20)])
    assert len(summaries) == inputstats.MAX_FEATURES  # later features are not kept


def test_summaries_subtract_merge_and_give_mean_and_variance() -> None:
    before: dict = {}
    inputstats.add_values(before, [("x", [1.0, 3.0])])
    after = inputstats.copy(before)
    inputstats.add_values(after, [("x", [2.0, 4.0, float("nan")])])
    added = inputstats.since(before, after)
    assert added["x"]["n"] == 2 and added["x"]["bins"] == {"p4": 1, "p8": 1, "nan": 1}
    merged: dict = {}
    inputstats.merge(merged, before)
    inputstats.merge(merged, added)
    mean, variance = inputstats.moments(merged["x"])
    assert mean == 2.5 and variance == 1.25 and merged["x"]["bins"] == after["x"]["bins"]


def test_the_batcher_summarises_one_successful_request_in_n(demo_store) -> None:
    engine = Engine(RuntimeSettings(device="cpu", intra_op_threads=1), BatchingSettings(input_sample_every=4))
    try:
        engine.load(demo_store / "mlp" / "1", "blue")
        body = {"input": np.full((1, 64), 0.5, dtype=np.float32)}
        for _ in range(12):
            engine.infer("mlp", body)
        (loaded,) = engine.loaded()
        summary = loaded.batcher.snapshot().inputs["input"]
        assert loaded.batcher.snapshot().inputs["input.std"]["bins"] == {"0": 3}  # a constant input: no spread
        assert summary["n"] == 3 and summary["sum"] == 1.5 and summary["bins"] == {inputstats.bin_of(0.5): 3}
        assert sum(sum(c.values()) for c in loaded.batcher.stats.labels.values()) == 12  # every answer is counted
    finally:
        engine.drain(5)


def test_a_failing_summary_costs_no_answer_and_turns_summaries_off(demo_store, monkeypatch, caplog) -> None:
    def broken(tensors, samples):
        raise ValueError("a bug in the summary")

    monkeypatch.setattr(inputstats, "features_of", broken)
    engine = Engine(RuntimeSettings(device="cpu", intra_op_threads=1), BatchingSettings(input_sample_every=1))
    try:
        engine.load(demo_store / "mlp" / "1", "blue")
        body = {"input": np.full((1, 64), 0.5, dtype=np.float32)}
        answers = [engine.infer("mlp", body) for _ in range(3)]
        assert all(a is not None for a in answers)
        (loaded,) = engine.loaded()
        assert loaded.batcher.stats.success == 3 and loaded.batcher.stats.inputs == {}
        assert [r.getMessage() for r in caplog.records if "summarising" in r.getMessage()] == [
            "summarising the inputs of 'mlp' failed; input drift is off for it"
        ]  # once, then off
    finally:
        engine.drain(5)
