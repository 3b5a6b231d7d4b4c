"""The engine: models, their blue/green slots, traffic routing, admission and drain.

Callers hand in decoded tensors and get outputs back; the engine knows no HTTP and no database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np

from serving import batchcost
from serving.batchcost import CostCurve, lone_request_times
from serving.batching import Batcher, BatchObserver, BatchTracer, Pending
from serving.cores import CoreClaim
from serving.errors import InvalidInput, ModelNotFound, Overloaded, ServingError, Unavailable, client_error_kind
from serving.measured import Measurements
from serving.memory import available_bytes
from serving.modelconfig import ModelConfig, effective_config
from serving.nodeload import OthersBusy
from serving.predictions import labels_of
from serving.runtime import (
    CPU,
    Session,
    check_spec_matches,
    declared_warmup,
    load_session,
    requested_providers,
    warmup_inputs,
)
from serving.settings import BatchingSettings, RuntimeSettings, parallelism
from serving.tensors import ModelSpec

log = logging.getLogger(__name__)

SLOTS = ("blue", "green")
# A lone-request session is kept where it runs the heaviest lone warm-up sample this much faster, timed within
# this budget (a second copy of the weights is not worth a gain within the timing's noise).
LONE_MIN_GAIN = 0.1
LONE_TIMING_BUDGET_S = 0.5
# A timing during which other processes kept more than this many cores busy (serving.nodeload) is taken again,
# after LONE_RETRY_S, up to LONE_TIMING_TRIES timings in all; the last one decides, however busy the node was then
# (a node that stays busy is one where every core is not free for a lone request either).
LONE_QUIET_CORES = 0.25
LONE_RETRY_S = 1.0
LONE_TIMING_TRIES = 3
# ... and made only where a second copy of the weights takes at most this share of the memory available.
LONE_MAX_MEMORY_SHARE = 0.1

# Builds the observer for one loaded version; the control plane passes one that records metrics.
ObserverFactory = Callable[[str, str, str], BatchObserver | None]
# Builds the batch tracer of one loaded version (model, version, slot); None: no tracing (the default).
TracerFactory = Callable[[str, str, str], BatchTracer | None]


@dataclass
class LoadedVersion:
    """One model version loaded into a slot."""

    spec: ModelSpec
    slot: str
    session: Session
    batcher: Batcher
    path: Path
    config: ModelConfig
    warmup_s: float = 0.0
    # One small input the session is known to run (a warm-up sample), for arena shrinking; None if none ran.
    sample: dict[str, np.ndarray] | None = field(default=None, repr=False)
    loaded_at: float = field(default_factory=time.time)
    # Shadow comparisons made while this version received copies of live traffic.
    shadow: ShadowStats = field(default_factory=lambda: ShadowStats())
    # The session with every core that runs lone requests (RuntimeSettings.lone_request_session); None: none.
    alone: Session | None = field(default=None, repr=False)

    @property
    def provider(self) -> str:
        return self.session.provider


@dataclass
class ShadowStats:
    """How often a shadow version's outputs agreed with the live version's (thread-safe counters)."""

    compared: int = 0
    agreed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, agreed: bool) -> None:
        with self._lock:
            self.compared += 1
            self.agreed += int(agreed)


def _compare_shadow(stats: ShadowStats, live: dict[str, np.ndarray], done: Future) -> None:
    if done.exception() is None:  # a failed shadow run is counted as an error in its own slot's stats
        stats.record(outputs_agree(live, done.result()))


def outputs_agree(
    live: dict[str, np.ndarray], shadow: dict[str, np.ndarray], rtol: float = 1e-3, atol: float = 1e-4
) -> bool:
    """Return whether two versions' outputs for one request agree.

    A classifier-like output (serving.predictions) agrees when every sample's predicted label is the
    same, so a retrained version that answers alike agrees and one whose answers collapse does not;
    any other output must match within tolerance.
    """
    if live.keys() != shadow.keys():
        return False
    for k, mine in live.items():
        theirs = shadow[k]
        if mine.shape != theirs.shape:
            return False
        labels = labels_of(mine)
        if labels is not None:
            if labels != labels_of(theirs):
                return False
        elif not np.allclose(mine, theirs, rtol=rtol, atol=atol):
            return False
    return True


@dataclass
class Routed:
    """The outcome of one inference: outputs and where they came from."""

    outputs: dict[str, np.ndarray]
    version: str
    slot: str
    batch_size: int
    queue_s: float
    compute_s: float


@dataclass(slots=True, eq=False)
class Ticket:
    """One admitted request: where it was routed, its place in the batcher, and its shadow copy, if any."""

    loaded: LoadedVersion
    pending: Pending  # its deadline is on the batcher's clock, time.monotonic
    shadow: tuple[LoadedVersion, Pending] | None = None

    def expire(self) -> None:
        """At the deadline: refuse the request (DeadlineExceeded) if it has not started running."""
        self.loaded.batcher.expire_if_queued(self.pending)

    def outcome(self, answer: Callable[[Pending], dict[str, np.ndarray]]) -> Routed:
        """Return the outcome from `answer(pending)` (the batcher's result or answer_of), or raise its error, named."""
        try:
            outputs = answer(self.pending)
        except ServingError as exc:
            raise _named(exc, self.loaded) from None
        return self.routed(outputs)

    def routed(self, outputs: dict[str, np.ndarray]) -> Routed:
        """Return the outcome; a shadow copy is compared with `outputs` when it finishes, never waited for."""
        if self.shadow is not None:
            target, copy = self.shadow
            copy.future.add_done_callback(partial(_compare_shadow, target.shadow, outputs))
        p = self.pending
        return Routed(outputs, self.loaded.spec.version, self.loaded.slot, p.batch_size, p.queue_s, p.compute_s)


def _named(exc: ServingError, loaded: LoadedVersion) -> ServingError:
    """Return `exc` naming the version and slot it was routed to, for the request's log line."""
    exc.version, exc.slot = loaded.spec.version, loaded.slot
    return exc


@dataclass
class _Model:
    slots: dict[str, LoadedVersion] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=lambda: {"blue": 100, "green": 0})
    shadow_slot: str | None = None  # gets a copy of every live request; its answers are compared, never returned


def read_manifest(version_dir: Path) -> dict:
    """Read `manifest.json` beside a `model.onnx`."""
    return json.loads((version_dir / "manifest.json").read_text())


class Engine:
    """Serve ONNX models from blue/green slots with dynamic batching."""

    def __init__(
        self,
        runtime: RuntimeSettings | None = None,
        batching: BatchingSettings | None = None,
        observer_factory: ObserverFactory | None = None,
        rng: random.Random | None = None,
        tracer_factory: TracerFactory | None = None,
        cores: CoreClaim | None = None,
        measured: Measurements | None = None,
    ) -> None:
        self.runtime = runtime or RuntimeSettings()
        # Where the workers of a node share what their loads measured (serving.measured); None: measure alone.
        self._measured = measured
        # The node's claim on its cores that lone-request runs take (serving.cores); None: this process's own.
        self._cores = cores
        self.batching = batching or BatchingSettings()
        self._observer_factory = observer_factory
        self._tracer_factory = tracer_factory
        self._models: dict[str, _Model] = {}
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._draining = False
        self._converged = False  # the owner served its desired state once (see mark_converged)

    # -- lifecycle -----------------------------------------------------------------------

    def load(self, version_dir: Path, slot: str = "blue") -> LoadedVersion:
        """Load `version_dir` (model.onnx + manifest.json) into a slot, warm it up, then publish it.

        The manifest's own batching values combine with the engine's (serving.modelconfig). Declared
        warm-up samples must all run, or the load fails; without them the inferred warm-up is best
        effort (a failure is logged, not fatal) and runs only where the input shapes are knowable.
        """
        if slot not in SLOTS:
            raise ValueError(f"slot must be one of {SLOTS}, not {slot!r}")
        spec = ModelSpec.from_manifest(read_manifest(version_dir))
        on_gpu = requested_providers(self.runtime)[0] != CPU
        b = self.batching
        own = b if spec.instances is None else replace(b, instances=spec.instances)
        instances, threads = parallelism(self.runtime, own, on_gpu)
        config = effective_config(spec, b, instances)
        # NOTE: one load at a time on the node (serving.measured): another worker's session building and warm-up
        # on a core beside this one's timings made its lone session look no faster (5.74 against 5.70 ms).
        with self._measured.loading() if self._measured is not None else nullcontext():
            session = load_session(version_dir / "model.onnx", replace(self.runtime, intra_op_threads=threads))
            check_spec_matches(spec, session.session)
            started = time.perf_counter()
            ran = self._warm_up(spec, session, config.max_batch_size)
            warmup_s = time.perf_counter() - started
            sample = min(ran, key=lambda t: sum(a.size for a in t.values()), default=None)
            key = self._measurement_key(version_dir, session, threads, instances, config.max_batch_size)
            # What another worker of the node measured for this load (serving.measured); what this one measures
            # is added to it, and written back for the next.
            record = self._measured.get(key) if key is not None and self._measured is not None else {}
            found = dict(record)
            if b.learn_batch_limits and config.combine and config.max_batch_size > 1:
                curve = self._shared_cost(record, spec, session, ran, config.max_batch_size)
                config = effective_config(spec, b, instances, curve)
            alone, lone_timing = self._lone_request_session(spec, version_dir / "model.onnx", session, ran, record)
            if key is not None and self._measured is not None and record != found:
                self._measured.put(key, record)
        if lone_timing is not None:
            threads = 0 if alone is None else alone.session.get_session_options().intra_op_num_threads
            config = replace(config, lone_request_threads=threads, lone_request_ms=lone_timing)
        observer = self._observer_factory(spec.name, spec.version, slot) if self._observer_factory else None
        batcher = Batcher(
            session.run,
            spec,
            max_batch_size=config.max_batch_size,
            max_queue_delay_s=config.max_queue_delay_s,
            max_queue_size=config.max_queue_size,
            combine=config.combine,
            preferred_batch_sizes=config.preferred_batch_sizes,
            instances=config.instances,
            observer=observer,
            tracer=self._tracer_factory(spec.name, spec.version, slot) if self._tracer_factory else None,
            name=f"{spec.name}-{slot}",
            input_sample_every=b.input_sample_every,
            batch_limits=config.batch_limits,
            run_alone=None if alone is None else alone.run,
            # Every CPU run takes the node's claim, so that a lone run anywhere sees it (and waits it out).
            cores=self._core_claim() if session.provider == CPU else None,
        )
        loaded = LoadedVersion(spec, slot, session, batcher, version_dir, config, warmup_s, sample, alone=alone)
        with self._lock:
            model = self._models.setdefault(spec.name, _Model())
            previous = model.slots.get(slot)
            model.slots[slot] = loaded
        if previous is not None:
            previous.batcher.close()
        log.info(
            "loaded %s version %s into %s on %s (warm-up %.2fs)",
            spec.name,
            spec.version,
            slot,
            loaded.provider,
            warmup_s,
        )
        return loaded

    def _measurement_key(
        self, version_dir: Path, session: Session, threads: int, instances: int, max_batch: int
    ) -> str | None:
        """Return the key of this load's measurements among the node's workers (serving.measured); None: not shared."""
        if self._measured is None:
            return None
        context = {
            "runtime": asdict(self.runtime),
            "batching": asdict(self.batching),
            "provider": session.provider,
            "threads": threads,
            "instances": instances,
            "max_batch": max_batch,
            "cores": os.cpu_count(),
        }
        try:
            return self._measured.key(version_dir, context)
        except OSError as exc:
            log.warning("%s: measurements not shared: %s", version_dir, exc)
            return None

    def _shared_cost(
        self, record: dict, spec: ModelSpec, session: Session, ran: list[dict[str, np.ndarray]], max_batch: int
    ) -> CostCurve | None:
        """The cost curve in the node's `record` of this load, else this one's, added to `record`."""
        if "curve" in record:
            try:
                curve = None if record["curve"] is None else CostCurve.from_json(record["curve"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("%s %s: ignored a shared cost curve: %s", spec.name, spec.version, exc)
            else:
                log.info("%s %s: batch limits %s from the node's measurement", spec.name, spec.version,
                         None if curve is None else curve.limits_under(max_batch))  # fmt: skip
                return curve
        # NOTE: with the node's cores to itself where it can: another worker's load timing its lone session
        # (every core, spinning) beside this one moved the limits chosen (textcls seq 32: 2 or 8).
        with self._core_claim().every():
            curve = self._measure_cost(spec, session, ran, max_batch)
        record["curve"] = None if curve is None else curve.to_json()
        return curve

    def _lone_request_session(
        self, spec: ModelSpec, model: Path, shared: Session, ran: list[dict[str, np.ndarray]], record: dict
    ) -> tuple[Session | None, dict[str, float] | None]:
        """Return a session with every core for lone requests where it runs one faster than `shared`, and the timing.

        Where another worker of the node timed this load already (its `record`, serving.measured), its decision
        stands: no second session where it kept none, and no timing where it kept one. A new timing is added to it.
        """
        cores = os.cpu_count() or 1
        threads = shared.session.get_session_options().intra_op_num_threads
        if not self.runtime.lone_request_session or shared.provider != CPU or not 0 < threads < cores:
            return None, None
        lone = [t for t in ran if _batch_of(spec, t) == 1]
        if not lone:
            return None, None  # NOTE: nothing known to run: an unmeasured second copy of the weights is not worth it
        available = available_bytes()
        if available is not None and model.stat().st_size > LONE_MAX_MEMORY_SHARE * available:
            log.info(
                "%s %s: no lone-request session: a second copy of its %.0f MiB would take over %d %% of the "
                "%.0f MiB available", spec.name, spec.version, model.stat().st_size / 2**20,
                LONE_MAX_MEMORY_SHARE * 100, available / 2**20,
            )  # fmt: skip
            return None, None
        sample = max(lone, key=lambda t: sum(a.size for a in t.values()))  # the heaviest lone request warmed up
        # Spinning within a run, not after it: without it two threads' hand-offs ate the gain (textcls seq 128:
        # 5.5 ms against 5.3 on one thread; 3.2 ms spinning; docs/benchmarks.md).
        every_core = replace(self.runtime, intra_op_threads=cores, allow_spinning=True, force_spinning_stop=True)
        known = _recorded_lone(record)
        if known is not None and not known[1]:
            return None, known[0]  # NOTE: the node timed it and kept none: no second copy of the weights to load
        try:
            session = load_session(model, every_core)
            if known is None:
                shared_s, alone_s, others = self._time_lone(spec, shared, session, sample)
        except Exception as exc:  # ONNX Runtime's own types; the shared session serves every request as before
            log.warning("%s %s: no lone-request session: %s", spec.name, spec.version, exc)
            return None, None
        if known is not None:
            log.info("%s %s: lone-request session %s, as the node timed it", spec.name, spec.version,
                     "kept" if known[1] else "not kept")  # fmt: skip
            return (session if known[1] else None), known[0]
        timing = {"shared": round(shared_s * 1e3, 6), "alone": round(alone_s * 1e3, 6)}
        if others is not None:
            timing["others_cores"] = round(others, 2)
        kept = alone_s <= shared_s * (1 - LONE_MIN_GAIN)
        record["lone"] = {**timing, "kept": kept}
        log.info(
            "%s %s: %s: %.3f ms on %d threads against %.3f ms on %d%s",
            spec.name, spec.version, "lone requests on every core" if kept else "no lone-request session",
            alone_s * 1e3, cores, shared_s * 1e3, threads,
            "" if others is None else f" (other processes kept {others:.2f} cores busy meanwhile)",
        )  # fmt: skip
        return (session if kept else None), timing

    def _time_lone(
        self, spec: ModelSpec, shared: Session, alone: Session, sample: dict[str, np.ndarray]
    ) -> tuple[float, float, float | None]:
        """Time `sample` on both sessions with the node's cores claimed; again while other processes kept them busy.

        Return the two times and the cores other processes used during the timing that counts (None: unknown).
        """
        for attempt in range(1, LONE_TIMING_TRIES + 1):
            with self._core_claim().every(), OthersBusy() as others:  # NOTE: the claim keeps this node's runs off
                shared_s, alone_s = lone_request_times(shared.run, alone.run, sample, LONE_TIMING_BUDGET_S)
            if others.cores is None or others.cores <= LONE_QUIET_CORES or attempt == LONE_TIMING_TRIES:
                break
            log.info(
                "%s %s: lone-request timing %d of %d disturbed: other processes kept %.2f cores busy; again in %.0f s",
                spec.name, spec.version, attempt, LONE_TIMING_TRIES, others.cores, LONE_RETRY_S,
            )  # fmt: skip
            time.sleep(LONE_RETRY_S)  # NOTE: a back-off: what disturbed it (a process starting or ending) may pass
        return shared_s, alone_s, others.cores

    def _core_claim(self) -> CoreClaim:
        with self._lock:
            if self._cores is None:
                self._cores = CoreClaim()
            return self._cores

    def _measure_cost(
        self, spec: ModelSpec, session: Session, ran: list[dict[str, np.ndarray]], max_batch: int
    ) -> CostCurve | None:
        """Time the warm-up samples at batch 1, 2, 4, ... per sequence bucket (serving.batchcost); None: none fit."""
        samples: dict[int, dict[str, np.ndarray]] = {}
        for tensors in sorted(ran, key=lambda t: sum(a.size for a in t.values())):
            try:
                _, seq_len = spec.check_inputs(tensors)
            except ServingError:  # a declared sample of a shape requests may not have: not a request's cost
                continue
            samples.setdefault(spec.bucket_of(seq_len), tensors)
        if not samples:
            return None
        b = self.batching
        # NOTE: with one intra-op thread on the CPU, ONNX Runtime runs in this thread: its CPU time is the
        # run's cost whatever else the cores do (a busy machine at load would otherwise skew the curve).
        alone = session.provider == CPU and session.session.get_session_options().intra_op_num_threads == 1
        clock = time.thread_time if alone else time.perf_counter
        try:
            curve = batchcost.measure(
                session.run, samples, max_batch, b.batch_cost_margin, b.batch_cost_budget_s, clock
            )
        except Exception as exc:  # ONNX Runtime's own types: a tiled sample the model refuses bounds nothing
            log.warning("%s %s: batch cost not measured, batches up to %d: %s", spec.name, spec.version, max_batch, exc)
            return None
        log.info(
            "%s %s: batch limits %s per sequence bucket from its cost curve (%.2fs)",
            spec.name,
            spec.version,
            curve.limits_under(max_batch),
            curve.seconds,
        )
        return curve

    def _warm_up(self, spec: ModelSpec, session: Session, max_batch: int) -> list[dict[str, np.ndarray]]:
        """Run the warm-up samples; return those that ran."""
        declared = declared_warmup(spec)
        for index, sample in enumerate(declared):
            try:
                session.run(sample)
            except Exception as exc:  # ONNX Runtime raises its own exception types
                raise ValueError(f"{spec.name} {spec.version}: declared warm-up sample {index} failed: {exc}") from None
        ran = declared
        if not declared:
            ran = []
            for sample in warmup_inputs(spec, max_batch, self.batching.warmup_max_sequence):
                try:
                    session.run(sample)
                    ran.append(sample)
                except Exception as exc:  # best effort: guessed inputs may be ones the model rightly refuses
                    log.warning("%s %s: inferred warm-up input skipped: %s", spec.name, spec.version, exc)
        return ran

    def unload(self, name: str, slot: str) -> None:
        """Take a slot out of service, finishing what it accepted first; a model left with no slot is forgotten."""
        with self._lock:
            model = self._models.get(name)
            loaded = model.slots.pop(slot, None) if model else None
            if model is not None:
                model.weights[slot] = 0
                if model.shadow_slot == slot:
                    model.shadow_slot = None
                if not model.slots:  # NOTE: else ready() would wait forever for a model nobody serves
                    del self._models[name]
        if loaded is None:
            raise ModelNotFound(f"model '{name}' has nothing loaded in slot {slot}")
        loaded.batcher.close()

    def set_batching(
        self,
        max_batch_size: int | None = None,
        max_queue_delay_ms: float | None = None,
        max_queue_size: int | None = None,
    ) -> BatchingSettings:
        """Change the batching limits for later loads and for every loaded version now; None keeps a limit.

        Each loaded version's batcher gets the new limits at once, combined with the model's own
        values as serving.modelconfig says (the engine's batch size caps a model's; a model's own
        delay and queue size win), so waiting executors apply them to what is already queued. Return the
        settings now in force. Not meant to race `load` (the reconciler calls both, one at a time).
        """
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, not {max_batch_size}")
        if max_queue_delay_ms is not None and not 0 <= max_queue_delay_ms < float("inf"):
            raise ValueError(f"max_queue_delay_ms must be a non-negative number, not {max_queue_delay_ms}")
        if max_queue_size is not None and max_queue_size < 1:
            raise ValueError(f"max_queue_size must be at least 1, not {max_queue_size}")
        changes = {
            key: value
            for key, value in (
                ("max_batch_size", max_batch_size),
                ("max_queue_delay_ms", max_queue_delay_ms),
                ("max_queue_size", max_queue_size),
            )
            if value is not None
        }
        with self._lock:
            self.batching = b = replace(self.batching, **changes)
            loaded = [v for m in self._models.values() for v in m.slots.values()]
        refused = 0
        for version in loaded:
            # A model's own delay and queue size stay; the engine's batch size caps its own.
            previous = version.config
            config = effective_config(version.spec, b, previous.instances, previous.cost_curve)
            version.config = config = replace(
                config, lone_request_threads=previous.lone_request_threads, lone_request_ms=previous.lone_request_ms
            )
            refused += version.batcher.reconfigure(
                max_batch_size=config.max_batch_size,
                max_queue_delay_s=config.max_queue_delay_s,
                max_queue_size=config.max_queue_size,
                batch_limits=config.batch_limits,
            )
        log.info(
            "batching now max_batch_size=%d max_queue_delay_ms=%g max_queue_size=%d (%d loaded versions%s)",
            b.max_batch_size,
            b.max_queue_delay_ms,
            b.max_queue_size,
            len(loaded),
            f"; {refused} queued requests over the new batch size refused" if refused else "",
        )
        return b

    def reload(
        self,
        name: str,
        slot: str,
        load: Callable[[], object] | None = None,
        drain_timeout_s: float | None = None,
    ) -> LoadedVersion:
        """Drain one slot and load the same version folder into it again, keeping the model served.

        The slot's traffic weight (and shadow copies) move to the other slot first; refused
        (ValueError) when the slot takes traffic and the other slot is empty. Then what the slot
        accepted finishes, `load` (default: `self.load(folder, slot)`; the control plane passes its
        load-and-verify) replaces the session, and the weights come back. If `load` raises or leaves
        the slot empty, the other slot keeps all the traffic and the error propagates.
        """
        other = "green" if slot == "blue" else "blue"
        with self._lock:
            model = self._require(name)
            current = model.slots.get(slot)
            if current is None:
                raise ModelNotFound(f"model '{name}' has nothing loaded in slot {slot}")
            weights, shadow = dict(model.weights), model.shadow_slot
            if weights.get(slot, 0) > 0:
                if other not in model.slots:
                    raise ValueError(
                        f"{slot} takes {weights[slot]} of {name}'s traffic and {other} is empty: "
                        "nothing would serve while it reloads"
                    )
                model.weights = {slot: 0, other: weights[slot] + weights.get(other, 0)}
            if shadow == slot:
                model.shadow_slot = None
        timeout = self.batching.default_timeout_ms / 1000 if drain_timeout_s is None else drain_timeout_s
        if not current.batcher.wait_idle(timeout):
            log.warning(
                "%s %s still busy after %.1fs; reloading anyway (it finishes what it took)", name, slot, timeout
            )
        try:
            if load is None:
                self.load(current.path, slot)
            else:
                load()
        finally:
            with self._lock:
                model = self._models.get(name)
                if model is not None and slot in model.slots:
                    model.weights = weights
                    if shadow is not None and shadow in model.slots:
                        model.shadow_slot = shadow
                elif model is not None and other in model.slots:
                    model.weights = {slot: 0, other: max(1, weights.get(slot, 0) + weights.get(other, 0))}
        with self._lock:
            reloaded = self._models.get(name)
            if reloaded is None or slot not in reloaded.slots:
                raise ModelNotFound(f"model '{name}' has nothing in slot {slot} after the reload")
            return reloaded.slots[slot]

    def set_weights(self, name: str, weights: dict[str, int]) -> None:
        """Set traffic weights between the slots of a model (non-negative, at least one loaded > 0)."""
        if set(weights) - set(SLOTS) or any(w < 0 for w in weights.values()):
            raise ValueError(f"weights must map {SLOTS} to non-negative integers")
        with self._lock:
            model = self._require(name)
            new = {slot: weights.get(slot, 0) for slot in SLOTS}
            if not any(new[s] > 0 for s in model.slots):
                raise ValueError(f"weights {new} send no traffic to a loaded slot of '{name}'")
            model.weights = new

    def set_shadow(self, name: str, slot: str | None) -> None:
        """Mirror live requests of a model into `slot` (None: stop); the slot must be loaded."""
        with self._lock:
            model = self._require(name)
            if slot is not None and slot not in model.slots:
                raise ValueError(f"cannot shadow into {slot}: nothing is loaded there")
            model.shadow_slot = slot

    def begin_drain(self) -> None:
        """Stop admitting new requests; readiness turns false at once."""
        self._draining = True

    def drain(self, timeout_s: float | None = None) -> bool:
        """Stop admitting, finish every accepted request, close the executors; return whether all finished."""
        self.begin_drain()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        finished = True
        for loaded in self.loaded():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            finished = loaded.batcher.close(remaining) and finished
        return finished

    # -- queries -------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    def mark_converged(self) -> None:
        """Say the engine holds what it should serve (its owner's first pass is done), even if that is nothing."""
        self._converged = True

    def ready(self) -> bool:
        """Return whether the server takes traffic: not draining, every loaded model live, and something loaded
        or the desired state served (a node with nothing deployed is ready, as Triton with no models)."""
        with self._lock:
            models = [m for m in self._models.values() if m.slots]
            return not self._draining and (bool(models) or self._converged) and all(self._live(m) for m in models)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Return whether a model (or one version of it) can take requests now."""
        with self._lock:
            model = self._models.get(name)
            if model is None or self._draining:
                return False
            if version is None:
                return bool(self._live(model))
            return any(v.spec.version == version for v in model.slots.values())

    def models(self) -> list[str]:
        """Return the names of models with at least one loaded slot."""
        with self._lock:
            return sorted(n for n, m in self._models.items() if m.slots)

    def loaded(self, name: str | None = None) -> list[LoadedVersion]:
        """Return loaded versions, of one model or all."""
        with self._lock:
            names = [name] if name is not None else list(self._models)
            return [v for n in names if n in self._models for v in self._models[n].slots.values()]

    def weights(self, name: str) -> dict[str, int]:
        """Return the traffic weights of a model's slots."""
        with self._lock:
            return dict(self._require(name).weights)

    def resolve(self, name: str, version: str | None = None, route_key: str | None = None) -> LoadedVersion:
        """Pick the loaded version for a request: by explicit version, else by traffic weight."""
        with self._lock:
            model = self._require(name)
            if version is not None:
                for loaded in model.slots.values():
                    if loaded.spec.version == version:
                        return loaded
                raise ModelNotFound(f"model '{name}' has no version {version} loaded")
            live = self._live(model)
            if not live:
                raise Unavailable(f"model '{name}' has no slot taking traffic", retry_after=1)
            return model.slots[self._pick(live, route_key)]

    def refused(self, name: str, kind: str, version: str | None = None, route_key: str | None = None) -> bool:
        """Count a request refused before it reached a version (its body, its size) in the one it would have.

        The version it named, else the one traffic weights (and `route_key`) pick. Return False when
        there is none (no such model, or nothing taking traffic): nothing was counted.
        """
        for wanted in (version, None) if version is not None else (None,):
            try:
                loaded = self.resolve(name, wanted, route_key)
            except ServingError:
                continue
            loaded.batcher.record_refused(kind)
            return True
        return False

    def check_admission(self, name: str) -> None:
        """Refuse at once (Overloaded) when every live slot of a model has a full queue.

        Called before decoding a request, so refusing the excess under overload costs almost nothing.
        """
        with self._lock:
            model = self._models.get(name)
            live = [model.slots[slot].batcher for slot, _ in self._live(model)] if model else []
        if live and all(b.queue_depth >= b.max_queue_size for b in live):
            raise Overloaded(
                f"every queue of '{name}' is full ({live[0].queue_depth} of {live[0].max_queue_size} samples waiting)",
                retry_after=1,
            )

    def infer(
        self,
        name: str,
        tensors: dict[str, np.ndarray],
        *,
        version: str | None = None,
        timeout_s: float | None = None,
        route_key: str | None = None,
        outputs: list[str] | None = None,
        trace: object | None = None,
    ) -> Routed:
        """Validate, admit, batch and run one request, waiting for it; raise a ServingError on any refusal.

        `outputs` names the outputs the caller will read, so an unknown one is refused before the model runs.
        `trace` (the caller's span, opaque here) goes to the version's batch tracer with its batch.
        """
        # NOTE: this thread waits for the answer anyway, so an idle batcher lets it run the batch itself.
        ticket = self._submit(name, tensors, version, timeout_s, route_key, outputs, None, trace)
        return ticket.outcome(ticket.loaded.batcher.result)

    def submit(
        self,
        name: str,
        tensors: dict[str, np.ndarray],
        on_done: Callable[[Pending], None],
        *,
        version: str | None = None,
        timeout_s: float | None = None,
        route_key: str | None = None,
        outputs: list[str] | None = None,
        trace: object | None = None,
    ) -> Ticket:
        """Admit one request as `infer` does, without waiting: `on_done` is called once it is answered.

        For callers that must not block (an event loop): `on_done` runs in an executor's thread and
        must only schedule the caller's wake-up; the caller then reads the answer with `finish`, and
        at the ticket's deadline calls `expire`.
        """
        return self._submit(name, tensors, version, timeout_s, route_key, outputs, on_done, trace)

    def finish(self, ticket: Ticket) -> Routed:
        """Return an answered ticket's outcome, or raise its ServingError (naming its version and slot)."""
        return ticket.outcome(ticket.loaded.batcher.answer_of)

    def _submit(
        self,
        name: str,
        tensors: dict[str, np.ndarray],
        version: str | None,
        timeout_s: float | None,
        route_key: str | None,
        outputs: list[str] | None,
        on_done: Callable[[Pending], None] | None,
        trace: object | None = None,
    ) -> Ticket:
        if self._draining:
            raise Unavailable("the engine is draining and admits no new requests", retry_after=1)
        loaded = self.resolve(name, version, route_key)
        try:
            batch, seq_len = loaded.spec.check_inputs(tensors, loaded.batcher.max_batch_size)
            known = [t.name for t in loaded.spec.outputs]
            unknown = [o for o in outputs or () if o not in known]
            if unknown:
                raise InvalidInput(f"unknown output(s) {unknown}; model has {known}", "unknown_output")
            default = loaded.config.default_timeout_s
            # A client may shorten its deadline, never lengthen it past the server's default.
            timeout = default if timeout_s is None else min(timeout_s, default)
            pending = loaded.batcher.submit(
                tensors, batch, seq_len, timeout, caller_runs=on_done is None, on_done=on_done, trace=trace
            )
        except ServingError as exc:
            kind = client_error_kind(exc)
            if kind is not None:  # refused for its own input before it ran: this version's client error
                loaded.batcher.record_refused(kind)
            raise _named(exc, loaded) from None
        ticket = Ticket(loaded, pending)
        if version is None:
            try:
                ticket.shadow = self._mirror(name, loaded, tensors, batch, seq_len, timeout)
            except Exception:  # NOTE: the live request is admitted (maybe to run inline): a copy never fails it
                log.exception("could not send a shadow copy of a request to '%s'", name)
        return ticket

    def _mirror(self, name: str, live: LoadedVersion, tensors, batch: int, seq_len: int, timeout: float):
        """Submit a copy to the shadow slot if there is one; a full shadow queue just skips the copy."""
        with self._lock:
            model = self._models.get(name)
            slot = model.shadow_slot if model else None
            target = model.slots.get(slot) if slot else None
        if target is None or target is live:
            return None
        try:
            return target, target.batcher.submit(tensors, batch, seq_len, timeout)
        except ServingError:
            return None

    # -- internals -----------------------------------------------------------------------

    def _require(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None or not model.slots:
            raise ModelNotFound(
                f"unknown model '{name}'; loaded: {sorted(n for n, m in self._models.items() if m.slots)}"
            )
        return model

    @staticmethod
    def _live(model: _Model) -> list[tuple[str, int]]:
        return [
            (slot, model.weights.get(slot, 0))
            for slot in SLOTS
            if slot in model.slots and model.weights.get(slot, 0) > 0
        ]

    def _pick(self, live: list[tuple[str, int]], route_key: str | None) -> str:
        total = sum(w for _, w in live)
        if route_key is None:
            point = self._rng.uniform(0, total)
        else:
            # Sticky routing: the same key lands on the same slot while the weights hold.
            digest = hashlib.blake2b(route_key.encode(), digest_size=8).digest()
            point = int.from_bytes(digest, "big") / 2**64 * total
        for slot, weight in live:
            point -= weight
            if point < 0:
                return slot
        return live[-1][0]

    def compact_memory(self) -> dict:
        """Shrink every loaded session's ONNX Runtime arenas, give free heap pages back, and report.

        Each session runs one smallest sample with arena shrinkage on (its CPU arena, and its GPU
        arena on CUDA), with its other runs held back meanwhile; then glibc's free pages go back to the
        OS (malloc_trim). Returns the process's memory before and after, per GPU the device memory
        NVML reports before and after, and per session what was shrunk.
        """
        from serving.memory import heap_stats, trim_heap
        from serving.telemetry import sample_gpus

        def reading() -> dict:
            heap = heap_stats()
            return {
                "heap": heap.as_dict() if heap is not None else None,
                "gpus": {g.index: g.memory_used_bytes for g in sample_gpus()},
            }

        started = time.perf_counter()
        before = reading()
        sessions = []
        for loaded in self.loaded():
            spec = loaded.spec
            if loaded.sample is None:  # nothing known to run: shrinking would need a guessed input
                continue
            report = loaded.session.shrink_arena(loaded.sample)
            sessions.append({"model": spec.name, "version": spec.version, "slot": loaded.slot, **report})
            if loaded.alone is not None:  # the lone-request session keeps an arena of its own
                report = loaded.alone.shrink_arena(loaded.sample)
                sessions.append(
                    {"model": spec.name, "version": spec.version, "slot": loaded.slot, "lone": True, **report}
                )
        trimmed = trim_heap()
        after = reading()
        return {
            "before": before,
            "after": after,
            "sessions": sessions,
            "heap_trimmed": trimmed,
            "seconds": round(time.perf_counter() - started, 4),
        }


def _batch_of(spec: ModelSpec, tensors: dict[str, np.ndarray]) -> int:
    """Return a warm-up sample's batch size (1 for a model without a batch axis; 0: not a request's shape)."""
    try:
        return spec.check_inputs(tensors)[0]
    except ServingError:
        return 0


def _recorded_lone(record: dict) -> tuple[dict[str, float], bool] | None:
    """The lone-request timing and decision in a node's record of a load (serving.measured); None: none."""
    lone = record.get("lone")
    try:
        timing = {"shared": float(lone["shared"]), "alone": float(lone["alone"])}
        if lone.get("others_cores") is not None:
            timing["others_cores"] = float(lone["others_cores"])
        return timing, bool(lone["kept"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
