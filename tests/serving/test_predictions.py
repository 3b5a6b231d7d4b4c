"""Which outputs have labels, what a sample's label is, and how many distinct labels a version keeps."""

from __future__ import annotations

import numpy as np

from serving.predictions import MAX_LABELS, OTHER, add_bounded, count_labels, octave, predicted_labels


def test_classifier_scores_integer_and_bytes_outputs_have_labels_others_do_not() -> None:
    outputs = {
        "scores": np.array([[0.1, 0.7, 0.2], [0.8, 0.1, 0.1]], dtype=np.float32),
        "ids": np.array([[3], [3]], dtype=np.int64),
        "names": np.array([b"cat", b"dog"], dtype=object),
        "embedding": np.zeros((2, 4, 8), dtype=np.float32),  # not classifier-like: not counted
        "score": np.array([[0.3], [-1.5]], dtype=np.float32),  # one value per sample: counted by octave
    }
    assert [name for name, _ in predicted_labels(outputs)] == ["scores", "ids", "names", "score"]
    counted: dict = {}
    count_labels(outputs, counted)
    assert counted == {
        ("scores", 1): 1, ("scores", 0): 1, ("ids", 3): 2, ("names", b"cat"): 1, ("names", b"dog"): 1,
        ("score", "[0.25,0.5)"): 1, ("score", "(-2,-1]"): 1,
    }  # fmt: skip
    totals: dict = {}
    add_bounded(totals, counted)  # named once per batch, under the batcher's lock
    assert totals == {
        "scores": {"0": 1, "1": 1}, "ids": {"3": 2}, "names": {"cat": 1, "dog": 1},
        "score": {"[0.25,0.5)": 1, "(-2,-1]": 1},
    }  # fmt: skip


def test_values_are_counted_in_octaves_every_version_shares() -> None:
    assert [octave(v) for v in (0.0, 1.0, 0.99, 3.0, -0.2, float("nan"))] == [
        "0", "[1,2)", "[0.5,1)", "[2,4)", "(-0.25,-0.125]", "nan",
    ]  # fmt: skip


def test_labels_past_the_bound_count_as_other() -> None:
    totals: dict = {}
    counted = add_bounded(totals, {("out", str(i)): 1 for i in range(MAX_LABELS + 5)})
    assert len(totals["out"]) == MAX_LABELS + 1 and totals["out"][OTHER] == 5
    assert counted[("out", OTHER)] == 5
    add_bounded(totals, {("out", "0"): 2, ("out", "new"): 1})  # known labels keep counting by name
    assert totals["out"]["0"] == 3 and totals["out"][OTHER] == 6


def test_shadow_answers_agree_on_the_same_predicted_label_and_other_outputs_within_tolerance() -> None:
    from serving.engine import outputs_agree

    live = {"probabilities": np.array([[0.1, 0.7, 0.2]], dtype=np.float32)}
    retrained = {"probabilities": np.array([[0.2, 0.5, 0.3]], dtype=np.float32)}  # other scores, same class
    broken = {"probabilities": np.array([[0.9, 0.05, 0.05]], dtype=np.float32)}
    assert outputs_agree(live, retrained) and not outputs_agree(live, broken)
    value = {"score": np.array([[1.0]], dtype=np.float32)}  # a value, not a label: compared within tolerance
    assert outputs_agree(value, {"score": np.array([[1.00001]], dtype=np.float32)})
    assert not outputs_agree(value, {"score": np.array([[1.1]], dtype=np.float32)})
