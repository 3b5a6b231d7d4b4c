"""A model archive's manifest.json: its schema, as pydantic models, and the rules across its fields.

`validate_manifest` checks a manifest's structure and returns it unchanged; any problem is an
InvalidArchive in the declared documents' one wording (`serving.declared`):

    manifest.json: field 'batching.max_batch_size': must be a whole number from 0 (no batch axis) to 65536, not -1
    manifest.json: field 'inputs[1].shape': input 'state' must have a dynamic batch axis (-1 at axis 0), ...

The models check each field's type and range; the root's `_across_fields` checks what depends on
several (a batch axis on every tensor when batching, sequence axes, golden and warm-up samples
against the declared tensors), each problem at the path of the field it concerns.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import numpy as np
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from controlplane.registry.errors import InvalidArchive
from serving.declared import Declared, Problem, describe
from serving.golden import decode_tensor
from serving.runtime import WARMUP_FILLS
from serving.tensors import DATATYPES

MANIFEST_FILE = "manifest.json"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PLATFORM = "onnxruntime_onnx"
MAX_GOLDEN_SAMPLES = 32
MAX_DIM = 2**31 - 1
MAX_WARMUP_SAMPLES = 8
MAX_WARMUP_COUNT = 16
MAX_WARMUP_VALUES = 2**24  # per tensor: a warm-up input is built in memory at every load


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _increasing(values: Any) -> bool:
    return (
        isinstance(values, list)
        and all(_is_int(b) and b >= 1 for b in values)
        and all(a < b for a, b in zip(values, values[1:]))
    )


def file_problem(problem: str) -> InvalidArchive:
    """A problem of the whole manifest file (too large, not JSON), in the same wording."""
    return InvalidArchive(f"{MANIFEST_FILE}: {problem}")


# (field, lowest, highest, whole numbers only) of the optional batching limits
_LIMITS = (
    ("max_queue_delay_ms", 0, 60_000, False),
    ("default_timeout_ms", 1, 3_600_000, False),
    ("max_queue_size", 1, 1_000_000, True),
    ("instances", 1, 64, True),
)


class _Batching(Declared):
    # NOTE: typed Any and checked below, so a wrong type and a value out of range read alike ("from 1 to 64").
    max_batch_size: Any = 32
    sequence_buckets: Any = Field(default_factory=list)
    preferred_batch_sizes: Any = Field(default_factory=list)
    max_queue_delay_ms: Any = None
    default_timeout_ms: Any = None
    max_queue_size: Any = None
    instances: Any = None

    @field_validator("max_batch_size")
    @classmethod
    def _max_batch(cls, value: Any) -> Any:
        if not _is_int(value) or not 0 <= value <= 65536:
            raise Problem(f"must be a whole number from 0 (no batch axis) to 65536, not {value!r}")
        return value

    @field_validator("sequence_buckets")
    @classmethod
    def _buckets(cls, value: Any) -> Any:
        if not _increasing(value):
            raise Problem(f"must be increasing positive whole numbers, not {value!r}")
        return value

    @model_validator(mode="after")
    def _limits(self) -> _Batching:
        preferred = self.preferred_batch_sizes
        if not _increasing(preferred) or any(b > self.max_batch_size for b in preferred):
            raise Problem(
                f"must be increasing whole numbers from 1 to max_batch_size {self.max_batch_size}, not {preferred!r}",
                at=("preferred_batch_sizes",),
            )
        for key, low, high, whole in _LIMITS:
            value = getattr(self, key)
            if value is not None and (not (_is_int if whole else _is_number)(value) or not low <= value <= high):
                what = "a whole number" if whole else "a number"
                raise Problem(f"must be {what} from {low} to {high}, not {value!r}", at=(key,))
        return self


class _Tensor(Declared):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    datatype: str
    shape: list[int]
    sequence_axis: int | None = None
    pad_value: Any = None

    @field_validator("datatype")
    @classmethod
    def _known(cls, datatype: str) -> str:
        if datatype not in DATATYPES:
            raise Problem(f"must be one of {sorted(DATATYPES)}, not {datatype!r}")
        return datatype

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: list[int]) -> list[int]:
        if not all(d == -1 or 1 <= d <= MAX_DIM for d in shape):
            raise Problem(
                f"must be a list of positive whole numbers, -1 for a dynamic axis, [] for a scalar; got {shape!r}"
            )
        return shape


class _Manifest(Declared):
    unknown_field_hint = "free-form data goes in 'metadata'"

    name: str
    version: str
    platform: str = PLATFORM
    inputs: Annotated[list[_Tensor], Field(min_length=1)]
    outputs: Annotated[list[_Tensor], Field(min_length=1)]
    batching: _Batching = Field(default_factory=_Batching)
    golden: Annotated[list[Any], Field(max_length=MAX_GOLDEN_SAMPLES)] = Field(default_factory=list)
    warmup: Annotated[list[Any], Field(max_length=MAX_WARMUP_SAMPLES)] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    description: str = ""

    @field_validator("name", "version")
    @classmethod
    def _matches(cls, value: str, info: ValidationInfo) -> str:
        pattern = NAME_RE if info.field_name == "name" else VERSION_RE
        if not pattern.match(value):
            raise Problem(f"must match {pattern.pattern}, not {value!r}")
        return value

    @field_validator("platform")
    @classmethod
    def _platform(cls, value: str) -> str:
        if value != PLATFORM:
            raise Problem(f"must be {PLATFORM!r}, not {value!r}")
        return value

    @model_validator(mode="after")
    def _across_fields(self) -> _Manifest:
        max_batch = self.batching.max_batch_size
        for key, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            _check_tensors(key, tensors, max_batch)
        if self.batching.sequence_buckets and not any(t.sequence_axis is not None for t in self.inputs):
            raise Problem("is set but no input has a sequence_axis", at=("batching", "sequence_buckets"))
        _check_golden(self.golden, self.inputs, self.outputs, max_batch)
        _check_warmup(self.warmup, self.inputs, max_batch)
        return self


def validate_manifest(data: Any) -> dict[str, Any]:
    """Check a manifest's structure and return it; raise InvalidArchive naming the fields that are wrong."""
    try:
        _Manifest.model_validate(data)
    except ValidationError as exc:
        raise InvalidArchive(describe(exc, MANIFEST_FILE, dict_word="an object")) from None
    return data


def _check_tensors(key: str, tensors: list[_Tensor], max_batch: int) -> None:
    kind = key[:-1]
    seen: dict[str, int] = {}
    for i, t in enumerate(tensors):
        if t.name in seen:
            raise Problem(f"{kind} '{t.name}' is declared twice ({key}[{seen[t.name]}] and here)", at=(key, i, "name"))
        seen[t.name] = i
        _check_sequence(t, kind, 1 if max_batch else 0, (key, i))
        # NOTE: with max_batch_size 0 (Triton's "no batch axis") a shape is the model's own, whole.
        if max_batch and (not t.shape or (t.shape[0] != -1 and not (t.shape[0] == 1 and max_batch == 1))):
            raise Problem(
                f"{kind} '{t.name}' must have a dynamic batch axis (-1 at axis 0), or 1 with "
                f"batching.max_batch_size 1; got shape {t.shape} (a model without a batch axis, "
                "or with scalars, declares batching.max_batch_size 0)",
                at=(key, i, "shape"),
            )


def _check_sequence(t: _Tensor, kind: str, first: int, at: tuple[str, int]) -> None:
    axis, pad_given = t.sequence_axis, "pad_value" in t.model_fields_set
    if axis is None:
        if pad_given:
            raise Problem(f"{kind} '{t.name}' has a pad_value but no sequence_axis", at=(*at, "pad_value"))
        return
    if t.datatype == "BYTES":
        raise Problem(
            f"{kind} '{t.name}' is BYTES and cannot have a sequence_axis (strings are not padded)",
            at=(*at, "sequence_axis"),
        )
    if not first <= axis < len(t.shape):
        raise Problem(
            f"must be an axis of {kind} '{t.name}' from {first} to {len(t.shape) - 1}, not {axis!r}",
            at=(*at, "sequence_axis"),
        )
    if t.shape[axis] != -1:
        raise Problem(
            f"must be a dynamic axis (-1) of {kind} '{t.name}'; axis {axis} is {t.shape[axis]}",
            at=(*at, "sequence_axis"),
        )
    if kind == "output":
        if pad_given:
            raise Problem(
                f"output '{t.name}' may not have a pad_value (outputs are trimmed, not padded)", at=(*at, "pad_value")
            )
        return
    pad = 0 if t.pad_value is None and not pad_given else t.pad_value
    dtype = DATATYPES[t.datatype]
    where = (*at, "pad_value")
    if not _is_number(pad) and not (dtype.kind == "b" and isinstance(pad, bool)):
        raise Problem(f"must be a number, not {pad!r}", at=where)
    if dtype.kind in "iu" and (not float(pad).is_integer() or not np.iinfo(dtype).min <= pad <= np.iinfo(dtype).max):
        raise Problem(f"{pad!r} is not a valid {t.datatype} value", at=where)
    if dtype.kind == "b" and pad not in (0, 1):
        raise Problem(f"{pad!r} is not a valid BOOL value", at=where)


_SAMPLE_KEYS = {"inputs", "outputs", "atol", "rtol"}


def _check_golden(samples: list[Any], inputs: list[_Tensor], outputs: list[_Tensor], max_batch: int) -> None:
    declared_in = {t.name: t for t in inputs}
    declared_out = {t.name: t for t in outputs}
    for index, sample in enumerate(samples):
        at = ("golden", index)
        if not isinstance(sample, dict) or set(sample) - _SAMPLE_KEYS or not {"inputs", "outputs"} <= set(sample):
            raise Problem("must be an object with inputs, outputs (and optionally atol, rtol)", at=at)
        for key in ("atol", "rtol"):
            if key in sample and (not _is_number(sample[key]) or sample[key] < 0):
                raise Problem(f"must be a non-negative number, not {sample[key]!r}", at=(*at, key))
        given_in, given_out = sample["inputs"], sample["outputs"]
        if not isinstance(given_in, dict) or set(given_in) != set(declared_in):
            got = sorted(given_in) if isinstance(given_in, dict) else given_in
            raise Problem(f"must be exactly {sorted(declared_in)}, got {got!r:.200}", at=(*at, "inputs"))
        if not isinstance(given_out, dict) or not given_out or set(given_out) - set(declared_out):
            got = sorted(given_out) if isinstance(given_out, dict) else given_out
            raise Problem(f"must name some of {sorted(declared_out)}, got {got!r:.200}", at=(*at, "outputs"))
        for key, given, declared in (("inputs", given_in, declared_in), ("outputs", given_out, declared_out)):
            for name, entry in given.items():
                _check_golden_tensor((*at, key, name), entry, declared[name], max_batch)


def _check_golden_tensor(at: tuple[Any, ...], entry: Any, declared: _Tensor, max_batch: int) -> None:
    if not isinstance(entry, dict) or set(entry) != {"datatype", "shape", "data"}:
        raise Problem("must be an object with datatype, shape and data", at=at)
    try:
        array = decode_tensor(entry)
    except ValueError as exc:
        raise Problem(str(exc), at=at) from None
    if entry["datatype"] != declared.datatype:
        raise Problem(f"is {entry['datatype']} but declared {declared.datatype}", at=(*at, "datatype"))
    shape = declared.shape
    if array.ndim != len(shape) or any(d >= 0 and a != d for a, d in zip(array.shape, shape)):
        raise Problem(f"has shape {list(array.shape)}, declared {shape}", at=(*at, "shape"))
    if max_batch and not 1 <= array.shape[0] <= max_batch:
        raise Problem(
            f"has batch {array.shape[0]}; it must be from 1 to batching.max_batch_size {max_batch}", at=(*at, "shape")
        )


def _check_warmup(samples: list[Any], inputs: list[_Tensor], max_batch: int) -> None:
    """Warm-up samples: {"inputs": {name: {"shape": [...], "fill": "zeros|ones|random"}}, "count": n}."""
    declared = {t.name: t for t in inputs}
    for index, sample in enumerate(samples):
        at = ("warmup", index)
        if (
            not isinstance(sample, dict)
            or set(sample) - {"inputs", "count"}
            or not isinstance(sample.get("inputs"), dict)
        ):
            raise Problem("must be an object with inputs (and optionally count)", at=at)
        count = sample.get("count", 1)
        if not _is_int(count) or not 1 <= count <= MAX_WARMUP_COUNT:
            raise Problem(f"must be a whole number from 1 to {MAX_WARMUP_COUNT}, not {count!r}", at=(*at, "count"))
        if set(sample["inputs"]) != set(declared):
            raise Problem(
                f"must be exactly {sorted(declared)}, got {sorted(sample['inputs'])!r:.200}", at=(*at, "inputs")
            )
        for name, entry in sample["inputs"].items():
            _check_warmup_tensor((*at, "inputs", name), entry, declared[name].shape, max_batch)


def _check_warmup_tensor(at: tuple[Any, ...], entry: Any, shape: list[int], max_batch: int) -> None:
    if not isinstance(entry, dict) or set(entry) - {"shape", "fill"} or "shape" not in entry:
        raise Problem("must be an object with shape (and optionally fill)", at=at)
    if entry.get("fill", "zeros") not in WARMUP_FILLS:
        raise Problem(f"must be one of {list(WARMUP_FILLS)}, not {entry['fill']!r}", at=(*at, "fill"))
    dims = entry["shape"]
    if not isinstance(dims, list) or not all(_is_int(d) and d >= 1 for d in dims):
        raise Problem(f"must be a list of positive whole numbers, not {dims!r:.100}", at=(*at, "shape"))
    if len(dims) != len(shape) or any(d >= 0 and a != d for a, d in zip(dims, shape)):
        raise Problem(f"has shape {dims}, declared {shape}", at=(*at, "shape"))
    if max_batch and dims[0] > max_batch:
        raise Problem(f"has batch {dims[0]}, over batching.max_batch_size {max_batch}", at=(*at, "shape"))
    if math.prod(dims) > MAX_WARMUP_VALUES:
        raise Problem(f"has {math.prod(dims)} values, over the limit of {MAX_WARMUP_VALUES}", at=(*at, "shape"))
