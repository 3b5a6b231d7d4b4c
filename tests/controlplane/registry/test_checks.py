"""Manifest and model checks for the signatures real models have: scalars, strings, no batch axis, images.

validate_manifest on manifests as data, check_model on real ONNX Runtime sessions over the models
in tests/signature_models.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from controlplane.registry.checks import check_model, validate_manifest
from controlplane.registry.errors import InvalidArchive
from controlplane.registry.graph_manifest import manifest_from_graph
from serving.golden import encode_tensor
from tests.signature_models import (
    IMAGE_INPUTS,
    IMAGE_OUTPUTS,
    VAD_INPUTS,
    VAD_OUTPUTS,
    strings_reference,
    vad_reference,
    write_image,
    write_strings,
    write_vad,
)


def manifest(inputs: list[dict], outputs: list[dict], **extra: Any) -> dict[str, Any]:
    return {"name": "m", "version": "1", "inputs": inputs, "outputs": outputs, **extra}


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidArchive) as info:
        validate_manifest(data)
    assert info.value.status == 400
    return info.value.message


def folder_manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


# -- batch axis and scalars ---------------------------------------------------------------------


def test_scalars_and_state_shapes_are_accepted_without_a_batch_axis() -> None:
    data = manifest(VAD_INPUTS, VAD_OUTPUTS, batching={"max_batch_size": 0})
    assert validate_manifest(data) is data


def test_with_batching_every_tensor_needs_a_dynamic_first_axis_and_scalars_point_to_max_batch_size_0() -> None:
    message = refusal(manifest(VAD_INPUTS, VAD_OUTPUTS))
    assert message.startswith(
        "manifest.json: field 'inputs[1].shape': input 'state' must have a dynamic batch axis (-1 at axis 0)"
    )
    assert "declares batching.max_batch_size 0" in message
    scalar = manifest(
        [{"name": "sr", "datatype": "INT64", "shape": []}], [{"name": "y", "datatype": "FP32", "shape": [-1]}]
    )
    assert "field 'inputs[0].shape': input 'sr' must have a dynamic batch axis" in refusal(scalar)
    # The existing allowance stays: a fixed 1 with max_batch_size 1.
    one = manifest(
        [{"name": "x", "datatype": "FP32", "shape": [1, 4]}], [{"name": "y", "datatype": "FP32", "shape": [1]}]
    )
    assert validate_manifest({**one, "batching": {"max_batch_size": 1}})


def test_every_datatype_including_bytes_is_accepted_but_strings_have_no_sequence_axis() -> None:
    for datatype in ("BOOL", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "FP16", "FP64", "BYTES"):
        tensors = [{"name": "t", "datatype": datatype, "shape": [-1, 2]}]
        assert validate_manifest(manifest(tensors, tensors))
    text = [{"name": "t", "datatype": "BYTES", "shape": [-1, -1], "sequence_axis": 1}]
    assert "field 'inputs[0].sequence_axis': input 't' is BYTES and cannot have a sequence_axis" in refusal(
        manifest(text, text)
    )


def test_without_a_batch_axis_a_sequence_axis_may_be_axis_0() -> None:
    seq = [{"name": "ids", "datatype": "INT64", "shape": [-1], "sequence_axis": 0, "pad_value": 0}]
    out = [{"name": "y", "datatype": "FP32", "shape": []}]
    assert validate_manifest(manifest(seq, out, batching={"max_batch_size": 0, "sequence_buckets": [8, 16]}))
    assert "field 'inputs[0].sequence_axis': must be an axis of input 'ids' from 1 to 0" in refusal(
        manifest(seq, [{**out[0], "shape": [-1]}])
    )


# -- per-model batching values ------------------------------------------------------------------


def test_a_manifests_own_batching_values_are_accepted() -> None:
    batching = {
        "max_batch_size": 16,
        "max_queue_delay_ms": 0.5,
        "max_queue_size": 64,
        "preferred_batch_sizes": [4, 8, 16],
        "default_timeout_ms": 2500,
        "instances": 2,
    }
    assert validate_manifest(manifest(IMAGE_INPUTS, IMAGE_OUTPUTS, batching=batching))


@pytest.mark.parametrize(
    ("batching", "message"),
    [
        (
            {"max_batch_size": -1},
            "field 'batching.max_batch_size': must be a whole number from 0 (no batch axis) to 65536",
        ),
        (
            {"max_batch_size": 8, "preferred_batch_sizes": [4, 16]},
            "field 'batching.preferred_batch_sizes': must be increasing whole numbers from 1 to max_batch_size 8, not [4, 16]",
        ),
        ({"preferred_batch_sizes": [8, 4]}, "field 'batching.preferred_batch_sizes': must be increasing whole numbers"),
        ({"max_queue_delay_ms": -1}, "field 'batching.max_queue_delay_ms': must be a number from 0 to 60000, not -1"),
        ({"max_queue_delay_ms": True}, "field 'batching.max_queue_delay_ms': must be a number"),
        ({"max_queue_size": 0}, "field 'batching.max_queue_size': must be a whole number from 1 to 1000000, not 0"),
        ({"default_timeout_ms": 0}, "field 'batching.default_timeout_ms': must be a number from 1 to 3600000, not 0"),
        ({"instances": 2.5}, "field 'batching.instances': must be a whole number from 1 to 64, not 2.5"),
        (
            {"max_delay": 3},
            "field 'batching.max_delay': is not a known field; known: ['default_timeout_ms', 'instances'",
        ),
    ],
)
def test_bad_batching_values_are_refused_by_name(batching: dict, message: str) -> None:
    assert message in refusal(manifest(IMAGE_INPUTS, IMAGE_OUTPUTS, batching=batching))


# -- warm-up samples ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("warmup", "message"),
    [
        ([{"inputs": {}}], "field 'warmup[0].inputs': must be exactly ['image']"),
        (
            [{"inputs": {"image": {"shape": [1, 4, 8, 8]}}}],
            "field 'warmup[0].inputs.image.shape': has shape [1, 4, 8, 8], declared [-1, 3, -1, -1]",
        ),
        (
            [{"inputs": {"image": {"shape": [1, 3, 8, 8], "fill": "noise"}}}],
            "field 'warmup[0].inputs.image.fill': must be one of",
        ),
        (
            [{"inputs": {"image": {"shape": [64, 3, 8, 8]}}}],
            "field 'warmup[0].inputs.image.shape': has batch 64, over batching.max_batch_size 8",
        ),
        ([{"inputs": {"image": {"shape": [1, 3, 8192, 8192]}}}], "values, over the limit of 16777216"),
        (
            [{"inputs": {"image": {"shape": [1, 3, 8, 8]}}, "count": 0}],
            "field 'warmup[0].count': must be a whole number from 1 to 16",
        ),
        ({"image": [1, 3, 8, 8]}, "field 'warmup': must be a list"),
        ([{"inputs": {"image": {"shape": [1, 3, 8, 8]}}}] * 9, "field 'warmup': must have at most 8 items"),
    ],
)
def test_bad_warm_up_samples_are_refused_by_name(warmup: Any, message: str) -> None:
    data = manifest(IMAGE_INPUTS, IMAGE_OUTPUTS, batching={"max_batch_size": 8}, warmup=warmup)
    assert message in refusal(data)


# -- check_model over real sessions -------------------------------------------------------------


def test_the_vad_and_strings_models_pass_with_golden_samples_of_scalars_and_strings(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    audio, state, sr = rng.standard_normal((2, 6)).astype(np.float32), np.zeros((2, 2, 8), np.float32), np.array(8000)
    expected = vad_reference(audio, state, sr)
    golden = [
        {
            "inputs": {"input": encode_tensor(audio), "state": encode_tensor(state), "sr": encode_tensor(sr)},
            "outputs": {"count": encode_tensor(expected["count"]), "stateN": encode_tensor(expected["stateN"])},
        }
    ]
    vad = write_vad(tmp_path / "vad", golden=golden)
    assert check_model(vad, validate_manifest(folder_manifest(vad))) is True
    text = np.array(["yes", "héllo"], dtype=object)
    golden = [
        {
            "inputs": {"text": encode_tensor(text)},
            "outputs": {k: encode_tensor(v) for k, v in strings_reference(text).items()},
        }
    ]
    strings = write_strings(tmp_path / "strings", golden=golden)
    assert check_model(strings, validate_manifest(folder_manifest(strings))) is True


def test_a_golden_string_that_differs_is_named(tmp_path: Path) -> None:
    text = np.array(["yes"], dtype=object)
    wrong = np.array(["yes"], dtype=object)
    golden = [{"inputs": {"text": encode_tensor(text)}, "outputs": {"marked": encode_tensor(wrong)}}]
    folder = write_strings(tmp_path / "strings", golden=golden)
    with pytest.raises(InvalidArchive, match=r"output 'marked' differs at 1 of 1 values \(e.g. index 0: got 'YES!'"):
        check_model(folder, validate_manifest(folder_manifest(folder)))


def test_a_declared_warm_up_sample_that_fails_refuses_the_push(tmp_path: Path) -> None:
    ok = write_image(tmp_path / "ok", warmup=[{"inputs": {"image": {"shape": [1, 3, 5, 5], "fill": "random"}}}])
    assert check_model(ok, validate_manifest(folder_manifest(ok))) is None
    bad = write_image(tmp_path / "bad", warmup=[{"inputs": {"image": {"shape": [1, 3, 1, 1]}}}])
    with pytest.raises(InvalidArchive, match="a declared warm-up sample fails to run: .*Conv"):
        check_model(bad, validate_manifest(folder_manifest(bad)))


# -- what `registry build` derives from a graph --------------------------------------------------


def test_a_graph_with_a_dynamic_first_axis_everywhere_is_batchable(tmp_path: Path) -> None:
    model = onnx.load(str(write_image(tmp_path / "image") / "model.onnx"))
    derived = manifest_from_graph(model, name="image", version="1", sequence_inputs={})
    assert "batching" not in derived  # the engine's default max batch size
    assert derived["inputs"] == IMAGE_INPUTS and derived["outputs"] == IMAGE_OUTPUTS
    validate_manifest(derived)


def test_a_graph_with_scalars_or_a_fixed_first_axis_gets_max_batch_size_0(tmp_path: Path) -> None:
    model = onnx.load(str(write_vad(tmp_path / "vad") / "model.onnx"))
    derived = manifest_from_graph(
        model,
        name="vad",
        version="1",
        sequence_inputs={},
        batching={"max_queue_size": 16, "preferred_batch_sizes": [], "instances": None},
        warmup=[{"inputs": {"input": {"shape": [1, 512]}, "state": {"shape": [2, 1, 8]}, "sr": {"shape": []}}}],
    )
    assert derived["batching"] == {"max_batch_size": 0, "max_queue_size": 16}
    assert derived["inputs"] == VAD_INPUTS and derived["outputs"] == VAD_OUTPUTS
    validate_manifest(derived)
    strings = manifest_from_graph(
        onnx.load(str(write_strings(tmp_path / "s") / "model.onnx")), name="s", version="1", sequence_inputs={}
    )
    assert strings["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
