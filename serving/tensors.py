"""Tensor and model signatures: what a model accepts, and checking a request against it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.errors import InvalidInput

# Open Inference Protocol datatype -> numpy dtype. BYTES is ONNX Runtime's tensor(string): a numpy
# object array of str (ONNX Runtime turns bytes objects into their repr, so text is what it takes).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_DTYPE_TO_DATATYPE = {dtype: name for name, dtype in DATATYPES.items()}

# ONNX Runtime's type strings, as `NodeArg.type` reports them.
_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def datatype_of(array: np.ndarray) -> str:
    """Return the protocol datatype name of a numpy array."""
    try:
        return _DTYPE_TO_DATATYPE[array.dtype]
    except KeyError:
        raise InvalidInput(f"unsupported numpy dtype {array.dtype}", "datatype") from None


def datatype_from_ort(type_string: str) -> str:
    """Translate an ONNX Runtime type string such as 'tensor(float)'."""
    return _ORT_TYPES.get(type_string, type_string)


@dataclass(frozen=True)
class TensorSpec:
    """One declared input or output; -1 marks a dynamic dim, and `()` a scalar.

    Axis 0 is the batch axis when the model batches (ModelSpec.max_batch_size > 0); otherwise the
    shape is the model's own, whole.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    sequence_axis: int | None = None
    pad_value: float = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        """Build a spec from a manifest entry."""
        seq = data.get("sequence_axis")
        return cls(
            name=str(data["name"]),
            datatype=str(data["datatype"]),
            shape=tuple(int(d) for d in data["shape"]),
            sequence_axis=None if seq is None else int(seq),
            pad_value=data.get("pad_value", 0),
        )

    def to_metadata(self) -> dict[str, Any]:
        """Describe the tensor as the protocol's model metadata does."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def to_config(self, batched: bool) -> dict[str, Any]:
        """Describe the tensor as Triton's model configuration does: dims without the batch axis when batching."""
        return {
            "name": self.name,
            "data_type": "TYPE_" + self.datatype.replace("BYTES", "STRING"),
            "dims": list(self.shape[1:] if batched else self.shape),
        }

    @property
    def dtype(self) -> np.dtype:
        return DATATYPES[self.datatype]


@dataclass(frozen=True)
class ModelSpec:
    """The signature of one model version and its own serving configuration from the manifest.

    `max_batch_size` 0 means the model has no batch axis (Triton's meaning): each request runs
    alone against the full declared shapes. The optional values (None or empty: use the engine's)
    override the engine-wide batching settings; see serving.modelconfig for how they combine.
    """

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 32
    sequence_buckets: tuple[int, ...] = ()
    platform: str = "onnxruntime_onnx"
    metadata: dict[str, Any] = field(default_factory=dict)
    max_queue_delay_ms: float | None = None
    max_queue_size: int | None = None
    preferred_batch_sizes: tuple[int, ...] = ()
    default_timeout_ms: float | None = None
    instances: int | None = None
    # Declared warm-up samples, as the manifest's "warmup" list holds them (see serving.modelconfig).
    warmup: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> ModelSpec:
        """Build a spec from a model manifest (see serving.demo_models for the shape)."""
        batching = manifest.get("batching", {})

        def optional(key: str, kind: type) -> Any:
            return None if batching.get(key) is None else kind(batching[key])

        return cls(
            name=str(manifest["name"]),
            version=str(manifest["version"]),
            inputs=tuple(TensorSpec.from_dict(t) for t in manifest["inputs"]),
            outputs=tuple(TensorSpec.from_dict(t) for t in manifest["outputs"]),
            max_batch_size=int(batching.get("max_batch_size", 32)),
            sequence_buckets=tuple(sorted(int(b) for b in batching.get("sequence_buckets", ()))),
            platform=str(manifest.get("platform", "onnxruntime_onnx")),
            metadata=dict(manifest.get("metadata", {})),
            max_queue_delay_ms=optional("max_queue_delay_ms", float),
            max_queue_size=optional("max_queue_size", int),
            preferred_batch_sizes=tuple(sorted(int(b) for b in batching.get("preferred_batch_sizes", ()))),
            default_timeout_ms=optional("default_timeout_ms", float),
            instances=optional("instances", int),
            warmup=tuple(manifest.get("warmup", ())),
        )

    @property
    def batched(self) -> bool:
        """Return whether axis 0 of every tensor is a batch axis requests may be merged along."""
        return self.max_batch_size > 0

    @property
    def has_sequence_axis(self) -> bool:
        return any(t.sequence_axis is not None for t in self.inputs)

    @property
    def max_sequence_length(self) -> int | None:
        return self.sequence_buckets[-1] if self.sequence_buckets else None

    def bucket_of(self, length: int) -> int:
        """Return the smallest sequence bucket that holds `length` (0 without a sequence axis)."""
        for bucket in self.sequence_buckets:
            if length <= bucket:
                return bucket
        return length

    def check_inputs(self, tensors: dict[str, np.ndarray], max_batch_size: int | None = None) -> tuple[int, int]:
        """Validate request tensors against the signature and a batch limit; return (batch, sequence length or 0).

        A model without a batch axis (max_batch_size 0) counts every request as a batch of 1.
        """
        declared = {t.name: t for t in self.inputs}
        missing = sorted(set(declared) - set(tensors))
        if missing:
            raise InvalidInput(
                f"missing input(s) {missing}; model '{self.name}' expects {sorted(declared)}", "unknown_input"
            )
        extra = sorted(set(tensors) - set(declared))
        if extra:
            raise InvalidInput(
                f"unexpected input(s) {extra}; model '{self.name}' expects {sorted(declared)}", "unknown_input"
            )
        batch: int | None = None
        seq_len: int | None = None
        for spec in self.inputs:
            array = tensors[spec.name]
            _check_tensor(spec, array)
            if self.batched:
                if batch is None:
                    batch = array.shape[0]
                elif array.shape[0] != batch:
                    raise InvalidInput(
                        f"inputs disagree on batch size: '{spec.name}' has {array.shape[0]}, others {batch}", "shape"
                    )
            if spec.sequence_axis is not None:
                length = array.shape[spec.sequence_axis]
                if seq_len is None:
                    seq_len = length
                elif length != seq_len:
                    raise InvalidInput(
                        f"inputs disagree on sequence length: '{spec.name}' has {length}, others {seq_len}", "shape"
                    )
        if not self.batched:
            batch = 1
        assert batch is not None
        if batch < 1:
            raise InvalidInput("batch size must be at least 1", "shape")
        limit = max(1, self.max_batch_size) if max_batch_size is None else max_batch_size
        if batch > limit:
            raise InvalidInput(f"batch size {batch} is over the limit of {limit} for '{self.name}'", "batch_size")
        if seq_len is not None:
            if seq_len < 1:
                raise InvalidInput("sequence length must be at least 1", "shape")
            longest = self.max_sequence_length
            if longest is not None and seq_len > longest:
                raise InvalidInput(
                    f"sequence length {seq_len} is over the limit of {longest} for '{self.name}'", "shape"
                )
        return batch, seq_len or 0


def _check_tensor(spec: TensorSpec, array: np.ndarray) -> None:
    """Raise InvalidInput unless one array fits one declared tensor's datatype and shape."""
    if array.dtype.kind in "US":
        raise InvalidInput(
            f"input '{spec.name}' is a numpy {array.dtype} array; BYTES takes an object array of str, "
            f"and the model expects {spec.datatype}",
            "datatype",
        )
    if array.dtype != spec.dtype:
        raise InvalidInput(
            f"input '{spec.name}' has datatype {datatype_of(array)}, model expects {spec.datatype}", "datatype"
        )
    if array.dtype.kind == "O" and not all(isinstance(v, str) for v in array.flat):
        raise InvalidInput(f"input '{spec.name}' is BYTES: every element must be a string", "datatype")
    if array.ndim != len(spec.shape):
        raise InvalidInput(
            f"input '{spec.name}' has shape {list(array.shape)}, model expects rank "
            f"{len(spec.shape)} shape {list(spec.shape)}",
            "shape",
        )
    for axis, (got, want) in enumerate(zip(array.shape, spec.shape)):
        if want >= 0 and got != want:
            raise InvalidInput(
                f"input '{spec.name}' has shape {list(array.shape)}, model expects "
                f"{list(spec.shape)} (axis {axis} must be {want})",
                "shape",
            )
