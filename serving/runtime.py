"""ONNX Runtime sessions: provider choice, session knobs, and what the session really got."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from serving.memory import ArenaLedger, shape_key
from serving.settings import RuntimeSettings
from serving.tensors import ModelSpec, TensorSpec, datatype_from_ort

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def cuda_available() -> bool:
    """Return whether this ONNX Runtime build offers the CUDA provider at all."""
    return CUDA in ort.get_available_providers()


def requested_providers(settings: RuntimeSettings) -> list[str | tuple[str, dict]]:
    """Return the provider list to ask for, CUDA first when the settings and build allow it."""
    if settings.device == "cpu":
        return [CPU]
    if not cuda_available():
        if settings.device == "cuda":
            log.error("FLIGHTDECK_DEVICE=cuda but this onnxruntime build has no CUDA provider; running on the CPU")
        return [CPU]
    options: dict[str, object] = {
        "device_id": settings.gpu_device_id,
        "arena_extend_strategy": settings.arena_extend_strategy,
    }
    if settings.gpu_mem_limit_bytes:
        options["gpu_mem_limit"] = settings.gpu_mem_limit_bytes
    return [(CUDA, options), CPU]


def session_options(settings: RuntimeSettings) -> ort.SessionOptions:
    """Build ONNX Runtime session options from the settings."""
    if settings.graph_optimization not in _OPT_LEVELS:
        raise ValueError(f"graph_optimization must be one of {sorted(_OPT_LEVELS)}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = _OPT_LEVELS[settings.graph_optimization]
    options.enable_cpu_mem_arena = settings.enable_cpu_mem_arena
    options.enable_mem_pattern = settings.enable_mem_pattern
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.allow_spinning else "0")
    if settings.force_spinning_stop:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 3
    return options


# Options of every ordinary run, built once: read-only while runs use them.
_QUIET_RUN = ort.RunOptions()
_QUIET_RUN.log_severity_level = 4

# ONNX Runtime run option that shrinks the listed arenas at the end of that run ("cpu:0;gpu:1").
ARENA_SHRINK_KEY = "memory.enable_memory_arena_shrinkage"


@dataclass
class Session:
    """A loaded ONNX Runtime session and the provider it really runs on.

    `run` is called from several batcher executor threads at once; `shrink_arena` waits for the
    runs in flight, holds new ones back for its one small run, and lets them go again.
    """

    session: ort.InferenceSession
    provider: str
    output_names: list[str]
    ledger: ArenaLedger = field(default_factory=ArenaLedger, repr=False, compare=False)
    _gate: threading.Condition = field(
        default_factory=lambda: threading.Condition(threading.Lock()), init=False, repr=False, compare=False
    )
    _running: int = field(default=0, init=False, repr=False, compare=False)
    _shrinking: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Without a CPU arena every run's memory goes back to glibc at its end: nothing to watch.
        self.ledger.enabled = self.ledger.enabled and self.session.get_session_options().enable_cpu_mem_arena

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch and return outputs by name; a failure raises ONNX Runtime's own exception."""
        # NOTE: ONNX Runtime would log a failed run's message itself, values of every request in the
        # batch included; the batcher logs failures once, per request, without other requests' data.
        with self._gate:
            while self._shrinking:
                self._gate.wait()
            self._running += 1
        try:
            values = self.ledger.run(shape_key(inputs), lambda: self.session.run(self.output_names, inputs, _QUIET_RUN))
        finally:
            with self._gate:
                self._running -= 1
                if self._shrinking:  # only a shrink waits on the runs in flight
                    self._gate.notify_all()
        return dict(zip(self.output_names, values))

    def arena_devices(self) -> list[str]:
        """Return the arenas this session can shrink, in ONNX Runtime's "device:id" form."""
        devices = []
        # Asking to shrink an arena the session does not have fails the whole run.
        if self.session.get_session_options().enable_cpu_mem_arena:
            devices.append("cpu:0")
        if self.provider == CUDA:
            options = self.session.get_provider_options().get(CUDA, {})
            devices.append(f"gpu:{int(options.get('device_id', 0))}")
        return devices

    def shrink_arena(self, sample: dict[str, np.ndarray]) -> dict:
        """Run `sample` once with arena shrinkage on, alone, so ONNX Runtime frees every idle arena region.

        Returns the arenas asked for and shrunk, errors by request, and the change in glibc's live bytes
        across the CPU shrink (negative: bytes the arena gave back to the heap).
        """
        devices = self.arena_devices()
        report: dict = {"provider": self.provider, "devices": devices, "shrunk": [], "errors": {}}
        report["heap_live_change_bytes"] = 0
        if not devices:
            return report
        with self._gate:
            while self._shrinking:
                self._gate.wait()
            self._shrinking = True
            while self._running:
                self._gate.wait()
        try:
            # All arenas in one run; where ONNX Runtime refuses the list (one of them is no arena), each alone.
            attempts = [devices] + ([[d] for d in devices] if len(devices) > 1 else [])
            for group in attempts:
                if set(group) <= set(report["shrunk"]):
                    continue
                options = ort.RunOptions()
                options.add_run_config_entry(ARENA_SHRINK_KEY, ";".join(group))

                def shrinking_run(o: ort.RunOptions = options) -> list:
                    return self.session.run(self.output_names, sample, o)

                try:
                    if "cpu:0" in group:
                        _, change = self.ledger.shrink(shrinking_run)
                    else:
                        shrinking_run()
                        change = 0
                except Exception as exc:  # ONNX Runtime raises its own exception types
                    report["errors"][";".join(group)] = str(exc)
                    continue
                report["heap_live_change_bytes"] += change
                report["shrunk"] += [d for d in group if d not in report["shrunk"]]
        finally:
            with self._gate:
                self._shrinking = False
                self._gate.notify_all()
        return report


def load_session(path: Path, settings: RuntimeSettings) -> Session:
    """Create a session; log loudly when CUDA was asked for but the session fell back to CPU."""
    providers = requested_providers(settings)
    session = ort.InferenceSession(str(path), sess_options=session_options(settings), providers=providers)
    # NOTE: ONNX Runtime falls back to the CPU silently, so trust the session, not the request.
    got = session.get_providers()[0]
    wanted = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
    if got != wanted:
        log.warning("session for %s asked for %s but got %s", path, wanted, got)
    if settings.device == "cuda" and got != CUDA:
        log.error("FLIGHTDECK device=cuda but %s runs on %s", path, got)
    return Session(session=session, provider=got, output_names=[o.name for o in session.get_outputs()])


def spec_from_session(session: ort.InferenceSession, name: str, version: str) -> ModelSpec:
    """Derive a signature from the graph when no manifest is given."""

    def convert(args: list) -> tuple[TensorSpec, ...]:
        return tuple(
            TensorSpec(a.name, datatype_from_ort(a.type), tuple(d if isinstance(d, int) else -1 for d in a.shape))
            for a in args
        )

    return ModelSpec(
        name=name, version=version, inputs=convert(session.get_inputs()), outputs=convert(session.get_outputs())
    )


def check_spec_matches(spec: ModelSpec, session: ort.InferenceSession) -> None:
    """Raise ValueError when the declared signature disagrees with the graph's."""
    graph = spec_from_session(session, spec.name, spec.version)
    for declared, actual, kind in ((spec.inputs, graph.inputs, "input"), (spec.outputs, graph.outputs, "output")):
        by_name = {t.name: t for t in actual}
        if sorted(by_name) != sorted(t.name for t in declared):
            raise ValueError(f"declared {kind}s {sorted(t.name for t in declared)} but the graph has {sorted(by_name)}")
        for t in declared:
            g = by_name[t.name]
            if g.datatype != t.datatype:
                raise ValueError(f"{kind} '{t.name}' declared {t.datatype} but the graph has {g.datatype}")
            if len(g.shape) != len(t.shape) or any(a >= 0 and d >= 0 and a != d for a, d in zip(g.shape, t.shape)):
                raise ValueError(f"{kind} '{t.name}' declared shape {list(t.shape)} but the graph has {list(g.shape)}")


WARMUP_FILLS = ("zeros", "ones", "random")


def fill_tensor(tensor: TensorSpec, shape: Sequence[int], fill: str, rng: np.random.Generator) -> np.ndarray:
    """Return an array of `tensor`'s datatype and `shape` filled with zeros, ones or random values."""
    if fill not in WARMUP_FILLS:
        raise ValueError(f"fill must be one of {WARMUP_FILLS}, not {fill!r}")
    shape = tuple(shape)
    dtype = tensor.dtype
    if dtype.kind == "O":  # BYTES: empty strings, "1", or short random digit strings
        values = {"zeros": "", "ones": "1"}
        array = np.empty(shape, dtype=object)
        for index in np.ndindex(shape):
            array[index] = values.get(fill) or str(rng.integers(0, 1000))
        return array
    if fill == "zeros":
        return np.zeros(shape, dtype=dtype)
    if fill == "ones":
        return np.ones(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    # Small non-negative integers (booleans alike): valid token ids, indices and masks.
    return rng.integers(0, 2, shape).astype(dtype)


def declared_warmup(spec: ModelSpec) -> list[dict[str, np.ndarray]]:
    """Return the manifest's warm-up samples as inputs: each input's full shape and fill (zeros/ones/random).

    A sample looks like {"inputs": {"image": {"shape": [1, 3, 224, 224], "fill": "random"}}}, with
    "fill" defaulting to "zeros" and `count` (default 1) saying how often it runs, as Triton's model_warmup.
    """
    rng = np.random.default_rng(0)
    by_name = {t.name: t for t in spec.inputs}
    samples = []
    for sample in spec.warmup:
        tensors = {
            name: fill_tensor(by_name[name], entry["shape"], entry.get("fill", "zeros"), rng)
            for name, entry in sample["inputs"].items()
        }
        samples.extend([tensors] * int(sample.get("count", 1)))
    return samples


def warmup_inputs(spec: ModelSpec, max_batch: int, max_sequence: int) -> list[dict[str, np.ndarray]]:
    """Return inferred warm-up inputs: batch 1 and the largest batch, at each sequence bucket.

    Only where the shapes are knowable: every dim fixed except the batch axis and a declared
    sequence axis. Otherwise (an image model of any height and width) there is no inferred
    warm-up, as in Triton, which warms up only what model_warmup declares.
    """
    rng = np.random.default_rng(0)
    first = 1 if spec.batched else 0
    for t in spec.inputs:
        if any(d < 0 and axis != t.sequence_axis for axis, d in enumerate(t.shape) if axis >= first):
            return []
    lengths = [b for b in spec.sequence_buckets if b <= max_sequence] or [min(max_sequence, 16)]
    if not spec.has_sequence_axis:
        lengths = [0]
    batches = sorted({1, max_batch}) if spec.batched else [0]
    samples = []
    for length in lengths:
        for batch in batches:
            tensors = {}
            for t in spec.inputs:
                shape = [length if axis == t.sequence_axis else d for axis, d in enumerate(t.shape)]
                if spec.batched:
                    shape[0] = batch
                # Ones are valid token ids and a full attention mask alike.
                tensors[t.name] = fill_tensor(t, shape, "random" if t.dtype.kind == "f" else "ones", rng)
            samples.append(tensors)
    return samples


def check_single_distribution() -> None:
    """Refuse to run with both onnxruntime and onnxruntime-gpu installed (they overwrite each other)."""
    from importlib.metadata import PackageNotFoundError, version

    installed = []
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            installed.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    if len(installed) > 1:
        raise RuntimeError(
            f"both {installed[0]} and {installed[1]} are installed; uninstall both and install one "
            "(make install ORT=cpu or ORT=gpu)"
        )
