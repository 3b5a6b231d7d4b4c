"""Small ONNX models with the signatures real models have, built with the `onnx` package for tests.

- `vad`: silero-vad's shape: audio [batch, samples], a state [2, batch, 8] carrying the batch on
  axis 1, a scalar INT64 sample rate; a scalar output too. No batch axis (max_batch_size 0).
- `strings`: BYTES in and out (ONNX Runtime's tensor(string)), and a vocabulary lookup; batched.
- `image`: a 3x3 convolution over images of any height and width (a 1x1 image is refused by
  ONNX Runtime), so the feature map's dims depend on the input; batched.
- `alltypes`: one Identity per datatype ONNX Runtime takes, batched.

Each `write_*` writes a version folder (model.onnx + manifest.json) and returns it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 19), helper.make_opsetid("ai.onnx.ml", 3)]

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _tensor(name: str, datatype: str, shape: list[int]) -> onnx.ValueInfoProto:
    dims = [None if d == -1 else d for d in shape]
    return helper.make_tensor_value_info(name, ONNX_TYPES[datatype], dims)


def _entry(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


def _write(folder: Path, graph: onnx.GraphProto, manifest: dict[str, Any]) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="flightdeck-tests")
    model.ir_version = 9  # what the installed onnxruntime reads
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _manifest(name: str, inputs: list[dict], outputs: list[dict], **extra: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "platform": "onnxruntime_onnx", "inputs": inputs, "outputs": outputs, **extra}


VAD_INPUTS = [_entry("input", "FP32", [-1, -1]), _entry("state", "FP32", [2, -1, 8]), _entry("sr", "INT64", [])]
VAD_OUTPUTS = [_entry("output", "FP32", [-1, 1]), _entry("stateN", "FP32", [2, -1, 8]), _entry("count", "INT64", [])]


def vad_reference(audio: np.ndarray, state: np.ndarray, sr: np.ndarray) -> dict[str, np.ndarray]:
    """What the vad model computes, in numpy."""
    return {
        "output": audio.sum(axis=1, keepdims=True) * np.float32(sr),
        "stateN": state + audio.mean(axis=1)[None, :, None],
        "count": np.array(audio.size, dtype=np.int64),
    }


def write_vad(folder: Path, **manifest: Any) -> Path:
    """output = sum(audio) * sr, stateN = state + mean(audio) per row, count = audio.size (a scalar)."""
    nodes = [
        helper.make_node("Cast", ["sr"], ["sr_f"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["axis1"], value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("ReduceSum", ["input", "axis1"], ["sum"], keepdims=1),
        helper.make_node("Mul", ["sum", "sr_f"], ["output"]),
        helper.make_node("ReduceMean", ["input", "axis1"], ["mean"], keepdims=0),
        helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0, 2], np.int64))),
        helper.make_node("Unsqueeze", ["mean", "axes"], ["mean3"]),
        helper.make_node("Add", ["state", "mean3"], ["stateN"]),
        helper.make_node("Size", ["input"], ["count"]),
    ]
    inputs = [_tensor(t["name"], t["datatype"], t["shape"]) for t in VAD_INPUTS]
    outputs = [_tensor(t["name"], t["datatype"], t["shape"]) for t in VAD_OUTPUTS]
    graph = helper.make_graph(nodes, "vad", inputs, outputs)
    defaults = {"batching": {"max_batch_size": 0}}
    return _write(folder, graph, _manifest("vad", VAD_INPUTS, VAD_OUTPUTS, **{**defaults, **manifest}))


STRINGS_INPUTS = [_entry("text", "BYTES", [-1])]
STRINGS_OUTPUTS = [_entry("marked", "BYTES", [-1]), _entry("is_yes", "BOOL", [-1]), _entry("ids", "INT64", [-1])]
VOCABULARY = ["no", "yes", "héllo"]


def strings_reference(text: np.ndarray) -> dict[str, np.ndarray]:
    """What the strings model computes, in numpy."""
    is_yes = text == "yes"
    marked = np.where(is_yes, "YES!", text).astype(object)
    ids = np.array([VOCABULARY.index(t) if t in VOCABULARY else -1 for t in text], dtype=np.int64)
    return {"marked": marked, "is_yes": is_yes, "ids": ids}


def write_strings(folder: Path, **manifest: Any) -> Path:
    """is_yes = text == "yes", marked = "YES!" there and the text elsewhere, ids = the text's vocabulary index."""
    nodes = [
        helper.make_node("Constant", [], ["yes"], value=helper.make_tensor("y", TensorProto.STRING, [], [b"yes"])),
        helper.make_node("Constant", [], ["mark"], value=helper.make_tensor("m", TensorProto.STRING, [], [b"YES!"])),
        helper.make_node("Equal", ["text", "yes"], ["is_yes"]),
        helper.make_node("Where", ["is_yes", "mark", "text"], ["marked"]),
        helper.make_node(
            "LabelEncoder",
            ["text"],
            ["ids"],
            domain="ai.onnx.ml",
            keys_strings=VOCABULARY,
            values_int64s=list(range(len(VOCABULARY))),
            default_int64=-1,
        ),
    ]
    inputs = [_tensor(t["name"], t["datatype"], t["shape"]) for t in STRINGS_INPUTS]
    outputs = [_tensor(t["name"], t["datatype"], t["shape"]) for t in STRINGS_OUTPUTS]
    graph = helper.make_graph(nodes, "strings", inputs, outputs)
    defaults = {"batching": {"max_batch_size": 8}}
    return _write(folder, graph, _manifest("strings", STRINGS_INPUTS, STRINGS_OUTPUTS, **{**defaults, **manifest}))


IMAGE_INPUTS = [_entry("image", "FP32", [-1, 3, -1, -1])]
IMAGE_OUTPUTS = [_entry("features", "FP32", [-1, 2, -1, -1]), _entry("pooled", "FP32", [-1, 2])]
IMAGE_KERNEL = np.random.default_rng(5).standard_normal((2, 3, 3, 3)).astype(np.float32)


def image_reference(image: np.ndarray) -> dict[str, np.ndarray]:
    """What the image model computes, in numpy (a valid 3x3 cross-correlation)."""
    n, _, h, w = image.shape
    features = np.zeros((n, 2, h - 2, w - 2), dtype=np.float32)
    for dy in range(3):
        for dx in range(3):
            patch = image[:, :, dy : dy + h - 2, dx : dx + w - 2]
            features += np.einsum("nchw,oc->nohw", patch, IMAGE_KERNEL[:, :, dy, dx])
    return {"features": features, "pooled": features.mean(axis=(2, 3))}


def write_image(folder: Path, **manifest: Any) -> Path:
    """features = a 3x3 convolution without padding (H-2 x W-2), pooled = its global average."""
    nodes = [
        helper.make_node("Conv", ["image", "kernel"], ["features"], kernel_shape=[3, 3]),
        helper.make_node("GlobalAveragePool", ["features"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["pooled"], axis=1),
    ]
    inputs = [_tensor(t["name"], t["datatype"], t["shape"]) for t in IMAGE_INPUTS]
    outputs = [_tensor(t["name"], t["datatype"], t["shape"]) for t in IMAGE_OUTPUTS]
    graph = helper.make_graph(
        nodes, "image", inputs, outputs, initializer=[numpy_helper.from_array(IMAGE_KERNEL, "kernel")]
    )
    defaults = {"batching": {"max_batch_size": 8}}
    return _write(folder, graph, _manifest("image", IMAGE_INPUTS, IMAGE_OUTPUTS, **{**defaults, **manifest}))


def write_alltypes(folder: Path, **manifest: Any) -> Path:
    """out_<DATATYPE> = in_<DATATYPE>, shape [-1, 2], for every datatype."""
    inputs = [_entry(f"in_{d}", d, [-1, 2]) for d in ONNX_TYPES]
    outputs = [_entry(f"out_{d}", d, [-1, 2]) for d in ONNX_TYPES]
    nodes = [helper.make_node("Identity", [f"in_{d}"], [f"out_{d}"]) for d in ONNX_TYPES]
    graph = helper.make_graph(
        nodes,
        "alltypes",
        [_tensor(t["name"], t["datatype"], t["shape"]) for t in inputs],
        [_tensor(t["name"], t["datatype"], t["shape"]) for t in outputs],
    )
    return _write(folder, graph, _manifest("alltypes", inputs, outputs, **manifest))


def sample_of(datatype: str, batch: int = 1, seed: int = 0) -> np.ndarray:
    """A [batch, 2] array of a datatype with values at its edges (extremes, negatives, text)."""
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        words = np.array(["", "héllo", "a b", "Ω", "yes", "0"], dtype=object)
        return words[rng.integers(0, len(words), (batch, 2))]
    if datatype == "BOOL":
        return rng.integers(0, 2, (batch, 2)).astype(bool)
    from serving.tensors import DATATYPES

    dtype = DATATYPES[datatype]
    if dtype.kind == "f":
        return (rng.standard_normal((batch, 2)) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (batch, 2), dtype=dtype, endpoint=True)
