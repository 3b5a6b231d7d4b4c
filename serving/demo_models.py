"""Deterministic demo ONNX models (a small-BERT text classifier and an MLP) for Flightdeck.

Models are built from scratch with onnx.helper so demos and tests need no downloads.
Weights come from a seed derived from (name, version), so every build of the same
(name, version) serializes to identical bytes while versions 1 and 2 differ.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from serving.files import replace_file

DEMO_MODELS: tuple[str, ...] = ("textcls", "mlp")
DEMO_VERSIONS: tuple[str, ...] = ("1", "2")

_OPSET = 17  # first opset with LayerNormalization
_IR_VERSION = 8  # the IR version that shipped with opset 17; keeps older runtimes able to load it
_PRODUCER = "flightdeck-demo"

# textcls hyper-parameters (roughly BERT-mini sized).
_VOCAB = 30000
_HIDDEN = 256
_LAYERS = 4
_HEADS = 4
_HEAD_DIM = _HIDDEN // _HEADS
_FFN = 1024
_MAX_POS = 512
_LABELS = ["negative", "neutral", "positive"]
_LN_EPS = 1e-12
_MASK_NEG = -1e4  # large enough that exp() underflows to exactly 0 in fp32 softmax

# mlp hyper-parameters.
_MLP_IN = 64
_MLP_HIDDEN = 128
_MLP_OUT = 10


def _seed(name: str, version: int) -> int:
    # hash() is salted per process, so derive the seed from a stable digest instead.
    digest = hashlib.sha256(f"flightdeck-demo/{name}/{version}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class _GraphBuilder:
    """Accumulate nodes and initializers under unique, readable names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._used: set[str] = set()

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def const(self, name: str, value: Any, dtype: type = np.float32) -> str:
        array = np.asarray(value, dtype=dtype)
        unique = self._unique(name)
        self.initializers.append(numpy_helper.from_array(array, unique))
        return unique

    def normal(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        return self.const(name, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: Any) -> str:
        out = self._unique(name or op_type)
        node_name = self._unique(f"{out}/{op_type}")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=node_name, **attrs))
        return out

    def dense(self, x: str, d_in: int, d_out: int, prefix: str, scale: float, out: str | None = None) -> str:
        w = self.normal(f"{prefix}.weight", (d_in, d_out), scale)
        b = self.normal(f"{prefix}.bias", (d_out,), scale)
        return self.op("Add", [self.op("MatMul", [x, w], f"{prefix}.matmul"), b], out or f"{prefix}.out")

    def layer_norm(self, x: str, size: int, prefix: str) -> str:
        gamma = self.const(f"{prefix}.gamma", np.ones(size))
        beta = self.const(f"{prefix}.beta", np.zeros(size))
        return self.op("LayerNormalization", [x, gamma, beta], f"{prefix}.out", axis=-1, epsilon=_LN_EPS)

    def model(
        self,
        graph_name: str,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        version: int,
        doc: str,
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", _OPSET)],
            producer_name=_PRODUCER,
            model_version=version,
            doc_string=doc,
        )
        model.ir_version = _IR_VERSION
        return model


def _attention(g: _GraphBuilder, x: str, mask_bias: str, prefix: str, scale: float) -> str:
    head_shape = g.const(f"{prefix}.heads_shape", [0, 0, _HEADS, _HEAD_DIM], np.int64)
    merged_shape = g.const(f"{prefix}.merged_shape", [0, 0, _HIDDEN], np.int64)

    def heads(name: str, perm: list[int]) -> str:
        proj = g.dense(x, _HIDDEN, _HIDDEN, f"{prefix}.{name}", scale)
        return g.op("Transpose", [g.op("Reshape", [proj, head_shape])], f"{prefix}.{name}_heads", perm=perm)

    q = heads("query", [0, 2, 1, 3])  # [B, H, S, D]
    k_t = heads("key", [0, 2, 3, 1])  # [B, H, D, S], pre-transposed for Q @ K^T
    v = heads("value", [0, 2, 1, 3])  # [B, H, S, D]
    inv_sqrt_d = g.const(f"{prefix}.inv_sqrt_d", 1.0 / np.sqrt(_HEAD_DIM))
    scores = g.op("Mul", [g.op("MatMul", [q, k_t]), inv_sqrt_d], f"{prefix}.scores")
    probs = g.op("Softmax", [g.op("Add", [scores, mask_bias])], f"{prefix}.probs", axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    merged = g.op("Reshape", [context, merged_shape], f"{prefix}.context")
    return g.dense(merged, _HIDDEN, _HIDDEN, f"{prefix}.output", scale)


def _gelu(g: _GraphBuilder, x: str, prefix: str) -> str:
    # Exact GELU via Erf (opset 17 has no Gelu op): 0.5 * x * (1 + erf(x / sqrt(2))).
    erf = g.op("Erf", [g.op("Mul", [x, g.const(f"{prefix}.inv_sqrt2", 1.0 / np.sqrt(2.0))])])
    one_plus = g.op("Add", [erf, g.const(f"{prefix}.one", 1.0)])
    return g.op("Mul", [g.op("Mul", [x, one_plus]), g.const(f"{prefix}.half", 0.5)], f"{prefix}.gelu")


def build_textcls(version: int) -> onnx.ModelProto:
    """Build the small-BERT-style text classifier for the given version."""
    g = _GraphBuilder(np.random.default_rng(_seed("textcls", version)))
    scale = 0.02  # BERT's initializer range

    tok = g.op("Gather", [g.normal("embeddings.token", (_VOCAB, _HIDDEN), scale), "input_ids"], axis=0)
    # Slice the position table to the runtime length so any seq <= 512 works.
    seq_len = g.op("Shape", ["input_ids"], "seq_len", start=1, end=2)
    positions = g.op(
        "Slice",
        [
            g.normal("embeddings.position", (_MAX_POS, _HIDDEN), scale),
            g.const("pos_start", [0], np.int64),
            seq_len,
            g.const("pos_axes", [0], np.int64),
        ],
        "positions",
    )
    x = g.layer_norm(g.op("Add", [tok, positions], "embeddings.sum"), _HIDDEN, "embeddings.ln")

    # Additive bias (1 - mask) * -1e4 shaped [B, 1, 1, S]: broadcasts over heads and query rows.
    mask = g.op("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.const("mask_one", 1.0), mask])
    bias = g.op("Mul", [inverted, g.const("mask_neg", _MASK_NEG)])
    mask_bias = g.op("Unsqueeze", [bias, g.const("mask_axes", [1, 2], np.int64)], "mask_bias")

    for i in range(_LAYERS):
        p = f"layer{i}"
        attn = _attention(g, x, mask_bias, f"{p}.attn", scale)
        x = g.layer_norm(g.op("Add", [x, attn], f"{p}.attn_residual"), _HIDDEN, f"{p}.attn_ln")
        hidden = _gelu(g, g.dense(x, _HIDDEN, _FFN, f"{p}.ffn_in", scale), f"{p}.ffn")
        ffn = g.dense(hidden, _FFN, _HIDDEN, f"{p}.ffn_out", scale)
        x = g.layer_norm(g.op("Add", [x, ffn], f"{p}.ffn_residual"), _HIDDEN, f"{p}.ffn_ln")

    # Pool the first token; padding is on the right, so it is always a real token.
    first = g.op("Gather", [x, g.const("first_index", 0, np.int64)], "pooled_first", axis=1)
    pooled = g.op("Tanh", [g.dense(first, _HIDDEN, _HIDDEN, "pooler", scale)], "pooled")
    g.dense(pooled, _HIDDEN, len(_LABELS), "classifier", scale, out="logits")

    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "attention_mask")
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(_LABELS)])]
    doc = f"Flightdeck demo text classifier v{version}: {_LAYERS}-layer transformer, labels {_LABELS}."
    return g.model("textcls", inputs, outputs, version, doc)


def build_mlp(version: int) -> onnx.ModelProto:
    """Build the small demo MLP classifier for the given version."""
    g = _GraphBuilder(np.random.default_rng(_seed("mlp", version)))
    # He init for the ReLU layers, Glorot for the softmax layer, so outputs stay spread out.
    h = g.op("Relu", [g.dense("input", _MLP_IN, _MLP_HIDDEN, "fc1", np.sqrt(2.0 / _MLP_IN))])
    h = g.op("Relu", [g.dense(h, _MLP_HIDDEN, _MLP_HIDDEN, "fc2", np.sqrt(2.0 / _MLP_HIDDEN))])
    logits = g.dense(h, _MLP_HIDDEN, _MLP_OUT, "fc3", np.sqrt(2.0 / (_MLP_HIDDEN + _MLP_OUT)))
    g.op("Softmax", [logits], "probabilities", axis=-1)

    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", _MLP_IN])]
    outputs = [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", _MLP_OUT])]
    doc = f"Flightdeck demo MLP v{version}: {_MLP_IN} -> {_MLP_HIDDEN} -> {_MLP_HIDDEN} -> {_MLP_OUT} softmax."
    return g.model("mlp", inputs, outputs, version, doc)


def build_model(name: str, version: str) -> onnx.ModelProto:
    """Build the demo model `name` at `version`."""
    builders = {"textcls": build_textcls, "mlp": build_mlp}
    if name not in builders:
        raise ValueError(f"unknown demo model {name!r}; expected one of {DEMO_MODELS}")
    return builders[name](int(version))


# Golden samples per (name, version), as JSON text so every caller gets its own copy.
_GOLDEN: dict[tuple[str, str], str] = {}


def _golden_inputs(name: str, version: str) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(_seed(name, int(version)) + 1)
    if name == "textcls":
        # One short sequence alone, then two right-padded to the same length (the mask matters).
        samples = []
        for lengths in ((6,), (8, 5)):
            width = max(lengths)
            ids = np.zeros((len(lengths), width), dtype=np.int64)
            mask = np.zeros((len(lengths), width), dtype=np.int64)
            for row, length in enumerate(lengths):
                ids[row, :length] = rng.integers(1, _VOCAB, size=length)
                mask[row, :length] = 1
            samples.append({"input_ids": ids, "attention_mask": mask})
        return samples
    # Multiples of 1/8 are exact in FP32 and short in JSON.
    return [{"input": (rng.integers(-16, 17, size=(batch, _MLP_IN)) / 8).astype(np.float32)} for batch in (1, 3)]


def golden_samples(name: str, version: str, model: onnx.ModelProto | None = None) -> list[dict]:
    """Return the demo model's golden samples: fixed inputs and the outputs ONNX Runtime gives on the CPU."""
    key = (name, version)
    if key not in _GOLDEN:
        import onnxruntime as ort

        from serving.golden import encode_tensor

        model = model or build_model(name, version)
        options = ort.SessionOptions()
        # NOTE: one thread, on the caller's: this may run in gunicorn's master, which forks afterwards.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        samples = []
        for inputs in _golden_inputs(name, version):
            outputs = dict(zip(names, session.run(names, inputs)))
            samples.append(
                {
                    "inputs": {n: encode_tensor(a) for n, a in inputs.items()},
                    "outputs": {n: encode_tensor(a) for n, a in outputs.items()},
                    "atol": 1e-4,
                    "rtol": 1e-3,
                }
            )
        _GOLDEN[key] = json.dumps(samples)
    return json.loads(_GOLDEN[key])


def demo_manifest(name: str, version: str, model: onnx.ModelProto | None = None) -> dict:
    """Return the serving manifest for demo model `name` at `version`, golden samples included.

    The golden outputs come from running the model, built here unless `model` is given.
    """
    if name not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {name!r}; expected one of {DEMO_MODELS}")
    return {**_signature(name, version), "golden": golden_samples(name, version, model)}


def _signature(name: str, version: str) -> dict:
    if name == "textcls":
        seq_input = {"datatype": "INT64", "shape": [-1, -1], "sequence_axis": 1, "pad_value": 0}
        return {
            "name": name,
            "version": version,
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": n, **seq_input} for n in ("input_ids", "attention_mask")],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, len(_LABELS)]}],
            "batching": {"max_batch_size": 32, "sequence_buckets": [16, 32, 64, 128, 256, 512]},
            "metadata": {
                "description": "Demo sentiment classifier: small BERT-style transformer with random weights.",
                "labels": list(_LABELS),
                "vocab_size": _VOCAB,
                "max_sequence_length": _MAX_POS,
            },
        }
    if name == "mlp":
        return {
            "name": name,
            "version": version,
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, _MLP_IN]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, _MLP_OUT]}],
            "batching": {"max_batch_size": 64},
            "metadata": {"description": "Demo MLP: 64 features to 10-class softmax, random weights."},
        }
    raise ValueError(f"unknown demo model {name!r}; expected one of {DEMO_MODELS}")


def write_demo_models(store_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write every demo model version under store_dir, skipping complete ones."""
    store_dir = pathlib.Path(store_dir)
    version_dirs: list[pathlib.Path] = []
    for name in DEMO_MODELS:
        for version in DEMO_VERSIONS:
            vdir = store_dir / name / version
            version_dirs.append(vdir)
            model_path, manifest_path = vdir / "model.onnx", vdir / "manifest.json"
            if model_path.exists() and manifest_path.exists():
                continue
            model = build_model(name, version)
            onnx.checker.check_model(model)
            vdir.mkdir(parents=True, exist_ok=True)
            # Model first, manifest last: a manifest only appears next to a complete model.
            replace_file(model_path, model.SerializeToString())
            manifest = json.dumps(demo_manifest(name, version, model), indent=2, sort_keys=True)
            replace_file(manifest_path, manifest.encode())
    return version_dirs
