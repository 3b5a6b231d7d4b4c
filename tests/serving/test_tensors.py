"""Model signatures: checking request tensors against them, sequence buckets, and manifests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving.demo_models import DEMO_MODELS, DEMO_VERSIONS, demo_manifest
from serving.errors import InvalidInput
from serving.tensors import DATATYPES, ModelSpec, TensorSpec, datatype_from_ort, datatype_of

TEXT = ModelSpec.from_manifest(demo_manifest("textcls", "1"))
MLP = ModelSpec.from_manifest(demo_manifest("mlp", "1"))


def text_inputs(batch: int = 2, seq: int = 12, mask_seq: int | None = None, mask_batch: int | None = None) -> dict:
    return {
        "input_ids": np.ones((batch, seq), dtype=np.int64),
        "attention_mask": np.ones(
            (batch if mask_batch is None else mask_batch, seq if mask_seq is None else mask_seq), dtype=np.int64
        ),
    }


def mlp_input(shape: tuple[int, ...] = (3, 64), dtype: type = np.float32) -> dict:
    return {"input": np.zeros(shape, dtype=dtype)}


def refused(spec: ModelSpec, tensors: dict, max_batch_size: int | None = None) -> str:
    with pytest.raises(InvalidInput) as info:
        if max_batch_size is None:
            spec.check_inputs(tensors)
        else:
            spec.check_inputs(tensors, max_batch_size)
    assert info.value.status == 400
    return info.value.message


# -- check_inputs: accepted requests ------------------------------------------------------------


def test_valid_inputs_return_batch_and_sequence_length() -> None:
    assert TEXT.check_inputs(text_inputs(batch=2, seq=12)) == (2, 12)
    assert MLP.check_inputs(mlp_input((3, 64))) == (3, 0)


def test_limits_are_inclusive() -> None:
    assert TEXT.check_inputs(text_inputs(batch=32, seq=512)) == (32, 512)
    assert TEXT.check_inputs(text_inputs(batch=1, seq=1)) == (1, 1)
    assert MLP.check_inputs(mlp_input((64, 64))) == (64, 0)


# -- check_inputs: each refusal names the problem -----------------------------------------------


def test_a_missing_input_is_named() -> None:
    message = refused(TEXT, {"input_ids": np.ones((1, 4), dtype=np.int64)})
    assert message == "missing input(s) ['attention_mask']; model 'textcls' expects ['attention_mask', 'input_ids']"


def test_an_extra_input_is_named() -> None:
    tensors = {**mlp_input(), "token_type_ids": np.zeros((3, 64), dtype=np.float32)}
    assert refused(MLP, tensors) == "unexpected input(s) ['token_type_ids']; model 'mlp' expects ['input']"


@pytest.mark.parametrize(("dtype", "name"), [(np.float64, "FP64"), (np.float16, "FP16"), (np.int64, "INT64")])
def test_a_wrong_datatype_is_named(dtype: type, name: str) -> None:
    assert refused(MLP, mlp_input(dtype=dtype)) == f"input 'input' has datatype {name}, model expects FP32"


def test_an_int32_mask_is_refused_for_an_int64_model() -> None:
    tensors = {**text_inputs(), "attention_mask": np.ones((2, 12), dtype=np.int32)}
    assert refused(TEXT, tensors) == "input 'attention_mask' has datatype INT32, model expects INT64"


def test_an_array_of_an_unsupported_dtype_is_refused() -> None:
    message = refused(MLP, {"input": np.zeros((1, 64), dtype=np.complex64)})
    assert "unsupported numpy dtype complex64" in message


@pytest.mark.parametrize("shape", [(64,), (1, 1, 64)])
def test_a_wrong_rank_is_refused(shape: tuple[int, ...]) -> None:
    message = refused(MLP, mlp_input(shape))
    assert message == f"input 'input' has shape {list(shape)}, model expects rank 2 shape [-1, 64]"


@pytest.mark.parametrize("width", [63, 65, 1])
def test_a_wrong_fixed_dimension_is_refused(width: int) -> None:
    message = refused(MLP, mlp_input((2, width)))
    assert message == f"input 'input' has shape [2, {width}], model expects [-1, 64] (axis 1 must be 64)"


def test_inputs_disagreeing_on_batch_size_are_refused() -> None:
    message = refused(TEXT, text_inputs(batch=2, mask_batch=3))
    assert message == "inputs disagree on batch size: 'attention_mask' has 3, others 2"


def test_inputs_disagreeing_on_sequence_length_are_refused() -> None:
    message = refused(TEXT, text_inputs(seq=12, mask_seq=10))
    assert message == "inputs disagree on sequence length: 'attention_mask' has 10, others 12"


def test_a_batch_over_the_models_max_batch_size_is_refused() -> None:
    assert refused(TEXT, text_inputs(batch=33, seq=4)) == "batch size 33 is over the limit of 32 for 'textcls'"
    assert refused(MLP, mlp_input((65, 64))) == "batch size 65 is over the limit of 64 for 'mlp'"


def test_a_caller_given_batch_limit_replaces_the_models_hint() -> None:
    # The engine passes its own cap (min of the server's and the model's); 33 fits mlp's hint of 64 but not 32.
    assert MLP.check_inputs(mlp_input((33, 64))) == (33, 0)
    assert refused(MLP, mlp_input((33, 64)), max_batch_size=32) == "batch size 33 is over the limit of 32 for 'mlp'"
    assert MLP.check_inputs(mlp_input((32, 64)), 32) == (32, 0)


def test_a_zero_batch_is_refused() -> None:
    assert refused(MLP, mlp_input((0, 64))) == "batch size must be at least 1"
    assert refused(TEXT, text_inputs(batch=0)) == "batch size must be at least 1"


def test_a_zero_length_sequence_is_refused() -> None:
    assert refused(TEXT, text_inputs(batch=1, seq=0)) == "sequence length must be at least 1"


def test_a_sequence_over_the_largest_bucket_is_refused() -> None:
    assert refused(TEXT, text_inputs(batch=1, seq=513)) == "sequence length 513 is over the limit of 512 for 'textcls'"


def test_without_buckets_a_sequence_has_no_length_limit() -> None:
    spec = ModelSpec(
        name="open",
        version="1",
        inputs=(TensorSpec("ids", "INT64", (-1, -1), sequence_axis=1),),
        outputs=(TensorSpec("y", "FP32", (-1, 2)),),
    )
    assert spec.max_sequence_length is None
    assert spec.check_inputs({"ids": np.ones((1, 5000), dtype=np.int64)}) == (1, 5000)


# -- buckets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(1, 16), (15, 16), (16, 16), (17, 32), (33, 64), (100, 128), (129, 256), (300, 512), (512, 512)],
)
def test_bucket_of_is_the_smallest_bucket_that_holds_the_length(length: int, bucket: int) -> None:
    assert TEXT.bucket_of(length) == bucket


def test_bucket_of_a_length_beyond_every_bucket_is_the_length_itself() -> None:
    assert TEXT.bucket_of(513) == 513


def test_bucket_of_without_buckets_is_the_length() -> None:
    assert MLP.sequence_buckets == ()
    assert MLP.bucket_of(0) == 0
    assert MLP.bucket_of(7) == 7


# -- manifests ----------------------------------------------------------------------------------


def to_manifest(spec: ModelSpec) -> dict:
    """Write a spec back in the manifest's form (what serving.demo_models writes to disk)."""

    def tensor(t: TensorSpec) -> dict:
        entry = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if t.sequence_axis is not None:
            entry.update(sequence_axis=t.sequence_axis, pad_value=t.pad_value)
        return entry

    batching: dict = {"max_batch_size": spec.max_batch_size}
    if spec.sequence_buckets:
        batching["sequence_buckets"] = list(spec.sequence_buckets)
    return {
        "name": spec.name,
        "version": spec.version,
        "platform": spec.platform,
        "inputs": [tensor(t) for t in spec.inputs],
        "outputs": [tensor(t) for t in spec.outputs],
        "batching": batching,
        "metadata": spec.metadata,
    }


@pytest.mark.parametrize("name", DEMO_MODELS)
@pytest.mark.parametrize("version", DEMO_VERSIONS)
def test_from_manifest_round_trips_a_demo_manifest(name: str, version: str) -> None:
    # Golden samples are the registry's and the reconciler's (serving.golden), not part of the signature.
    manifest = {k: v for k, v in demo_manifest(name, version).items() if k != "golden"}
    # Through JSON, as the manifest travels on disk.
    spec = ModelSpec.from_manifest(json.loads(json.dumps(manifest)))
    assert to_manifest(spec) == manifest
    assert ModelSpec.from_manifest(to_manifest(spec)) == spec


def test_textcls_manifest_gives_the_signature_and_batching_hints() -> None:
    assert (TEXT.name, TEXT.version, TEXT.platform) == ("textcls", "1", "onnxruntime_onnx")
    assert [t.name for t in TEXT.inputs] == ["input_ids", "attention_mask"]
    assert all(t.datatype == "INT64" and t.shape == (-1, -1) and t.sequence_axis == 1 for t in TEXT.inputs)
    assert all(t.dtype == np.dtype(np.int64) and t.pad_value == 0 for t in TEXT.inputs)
    assert TEXT.outputs == (TensorSpec("logits", "FP32", (-1, 3)),)
    assert TEXT.max_batch_size == 32
    assert TEXT.sequence_buckets == (16, 32, 64, 128, 256, 512)
    assert TEXT.has_sequence_axis and TEXT.max_sequence_length == 512
    assert TEXT.metadata["labels"] == ["negative", "neutral", "positive"]
    assert [t.to_metadata() for t in TEXT.inputs] == [
        {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
    ]


def test_mlp_manifest_gives_the_signature_and_batching_hints() -> None:
    assert MLP.inputs == (TensorSpec("input", "FP32", (-1, 64)),)
    assert MLP.outputs == (TensorSpec("probabilities", "FP32", (-1, 10)),)
    assert MLP.max_batch_size == 64
    assert not MLP.has_sequence_axis and MLP.max_sequence_length is None
    assert MLP.inputs[0].dtype == np.dtype(np.float32)


def test_manifest_defaults_and_unsorted_buckets() -> None:
    spec = ModelSpec.from_manifest(
        {
            "name": "m",
            "version": 3,
            "inputs": [{"name": "ids", "datatype": "INT64", "shape": ["-1", 8], "sequence_axis": "1"}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
            "batching": {"sequence_buckets": [64, "8", 16]},
        }
    )
    assert spec.version == "3"
    assert spec.platform == "onnxruntime_onnx"
    assert spec.max_batch_size == 32
    assert spec.sequence_buckets == (8, 16, 64)
    assert spec.metadata == {}
    assert spec.inputs[0] == TensorSpec("ids", "INT64", (-1, 8), sequence_axis=1, pad_value=0)
    no_batching = ModelSpec.from_manifest({**demo_manifest("mlp", "1"), "batching": {}})
    assert no_batching.max_batch_size == 32 and no_batching.sequence_buckets == ()


# -- datatypes ----------------------------------------------------------------------------------


def test_datatype_names_and_numpy_dtypes_correspond_both_ways() -> None:
    for name, dtype in DATATYPES.items():
        assert datatype_of(np.zeros(1, dtype=dtype)) == name
    # BYTES is ONNX Runtime's tensor(string): an object array of str.
    assert DATATYPES["BYTES"] == np.dtype(object)
    assert datatype_from_ort("tensor(string)") == "BYTES"


@pytest.mark.parametrize(
    ("ort_type", "datatype"),
    [("tensor(float)", "FP32"), ("tensor(int64)", "INT64"), ("tensor(float16)", "FP16"), ("tensor(bool)", "BOOL")],
)
def test_onnx_runtime_type_strings_translate(ort_type: str, datatype: str) -> None:
    assert datatype_from_ort(ort_type) == datatype


# -- scalars, strings, models without a batch axis, per-model configuration ----------------------

UNBATCHED = ModelSpec(
    name="vad",
    version="1",
    inputs=(TensorSpec("state", "FP32", (2, -1, 8)), TensorSpec("sr", "INT64", ())),
    outputs=(TensorSpec("count", "INT64", ()),),
    max_batch_size=0,
)
WORDS = ModelSpec(name="words", version="1", inputs=(TensorSpec("text", "BYTES", (-1,)),), outputs=(), max_batch_size=4)


def test_a_model_without_a_batch_axis_counts_each_request_as_one_sample() -> None:
    assert not UNBATCHED.batched and WORDS.batched
    # Axis 1 of state is free and no batch limit applies: 50 is fine.
    assert UNBATCHED.check_inputs({"state": np.zeros((2, 50, 8), np.float32), "sr": np.array(8000)}) == (1, 0)
    assert UNBATCHED.check_inputs({"state": np.zeros((2, 50, 8), np.float32), "sr": np.array(8000)}, 1) == (1, 0)


def test_a_scalar_input_must_be_a_scalar() -> None:
    state = np.zeros((2, 1, 8), np.float32)
    message = refused(UNBATCHED, {"state": state, "sr": np.array([8000])})
    assert message == "input 'sr' has shape [1], model expects rank 0 shape []"
    message = refused(UNBATCHED, {"state": np.zeros((3, 1, 8), np.float32), "sr": np.array(8000)})
    assert message == "input 'state' has shape [3, 1, 8], model expects [2, -1, 8] (axis 0 must be 2)"


def test_string_inputs_are_object_arrays_of_str() -> None:
    assert WORDS.check_inputs({"text": np.array(["a", "bé", ""], dtype=object)}) == (3, 0)
    assert refused(WORDS, {"text": np.array(["a", b"b"], dtype=object)}) == (
        "input 'text' is BYTES: every element must be a string"
    )
    assert refused(WORDS, {"text": np.array(["a"])}) == (
        "input 'text' is a numpy <U1 array; BYTES takes an object array of str, and the model expects BYTES"
    )
    assert refused(WORDS, {"text": np.zeros(2, np.float32)}) == "input 'text' has datatype FP32, model expects BYTES"
    assert refused(WORDS, {"text": np.array(list("abcde"), dtype=object)}) == (
        "batch size 5 is over the limit of 4 for 'words'"
    )


def test_metadata_keeps_the_models_own_shape_and_config_drops_the_batch_axis_only_when_batching() -> None:
    state, sr = UNBATCHED.inputs
    assert sr.to_metadata() == {"name": "sr", "datatype": "INT64", "shape": []}
    assert state.to_config(batched=False) == {"name": "state", "data_type": "TYPE_FP32", "dims": [2, -1, 8]}
    assert WORDS.inputs[0].to_config(batched=True) == {"name": "text", "data_type": "TYPE_STRING", "dims": []}


def test_a_manifests_own_batching_values_and_warm_up_are_read() -> None:
    warmup = [{"inputs": {"input": {"shape": [2, 64], "fill": "ones"}}}]
    manifest = {
        **demo_manifest("mlp", "1"),
        "batching": {
            "max_batch_size": 16,
            "max_queue_delay_ms": 5,
            "max_queue_size": 40,
            "preferred_batch_sizes": [8, 4],
            "default_timeout_ms": 2500,
            "instances": 2,
        },
        "warmup": warmup,
    }
    spec = ModelSpec.from_manifest(manifest)
    assert (spec.max_batch_size, spec.max_queue_delay_ms, spec.max_queue_size) == (16, 5.0, 40)
    assert (spec.preferred_batch_sizes, spec.default_timeout_ms, spec.instances) == ((4, 8), 2500.0, 2)
    assert spec.warmup == tuple(warmup)
    unset = ModelSpec.from_manifest(demo_manifest("mlp", "1"))
    assert (unset.max_queue_delay_ms, unset.max_queue_size, unset.default_timeout_ms, unset.instances) == (None,) * 4
    assert unset.preferred_batch_sizes == () and unset.warmup == ()
