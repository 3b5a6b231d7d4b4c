"""The dynamic batcher: a bounded queue, deadlines, shape groups and padding, per loaded version.

Requests wait in groups of mergeable shapes (serving.assembly). Dispatch rule: the oldest request's
group leaves when it is full, when that request has waited `max_queue_delay`, or at once when an
executor was idle (nothing queued, nothing to wait for), so a lightly loaded engine never pays the
batching window. Quieter still: a caller who will wait for its own answer (`submit(...,
caller_runs=True)`) and finds nothing queued or running, after `INLINE_AFTER` requests in a row that
found the same, runs its request itself in `result`, sparing two thread hand-offs; it counts as one
of the `instances` runs. Under concurrent load requests find others queued or running, so they keep
being batched by the executors. A run of one request that starts with nothing else running or queued
(an inline run, or an executor's on an otherwise idle batcher) goes to `run_alone` when the engine gave
one: a session whose intra-op threads use every core, where the shared session's are shared out
among the instances (serving.engine keeps it only where it measured it faster), provided no other
run on the node holds the cores (serving.cores). Before its delay, any group leaves once it is full
or can form one of the preferred batch sizes (the largest it can; Triton's `preferred_batch_size`). Because the oldest
request's group always goes first once due, a rare shape is never starved by a common one. "Full"
is the group's batch limit: the max batch size, or less where the version's cost curve, timed at load,
stopped paying earlier for the group's sequence bucket (serving.batchcost).

When a merged batch fails, serving.isolation bisects it, so only a request that fails on its own
gets an error, and that error only ever describes its own data; a failure caused by the input is a
400 (`InputRejected`, serving.faults), anything else a 500.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from serving import inputstats
from serving.assembly import GroupKey, Part, group_key
from serving.batchcost import limit_for
from serving.batchstats import BatcherSnapshot, BatcherStats, BatchObserver, BatchTracer, RequestOutcome
from serving.cores import CoreClaim
from serving.errors import (
    DeadlineExceeded,
    InferenceFailed,
    InputRejected,
    InvalidInput,
    Overloaded,
    ServingError,
    Unavailable,
)
from serving.faults import is_input_fault, trim
from serving.histogram import Histogram
from serving.isolation import Isolated, RunBatch, run_isolated
from serving.predictions import add_bounded, count_labels
from serving.tensors import ModelSpec
from serving.threadnames import executor_name, name_in_kernel

log = logging.getLogger(__name__)

# A caller runs its own request once this many requests in a row found the batcher idle (see Batcher.submit).
INLINE_AFTER = 8


class _State(enum.Enum):
    QUEUED = 1
    RUNNING = 2
    DONE = 3


@dataclass(eq=False)
class Pending:
    """One accepted request waiting for its result."""

    tensors: dict[str, np.ndarray]
    batch: int
    seq_len: int
    enqueued_at: float
    deadline: float
    group: GroupKey | None = None  # set when queued: the shapes it may share a batch with
    # Where a queued request's answer goes: its future; or `answer`, read by the caller's own thread (an
    # inline run) or after `on_done` (called in whichever thread answered it: an event loop's caller).
    future: Future | None = None
    on_done: Callable[[Pending], None] | None = None
    answer: dict[str, np.ndarray] | ServingError | None = None
    state: _State = _State.QUEUED
    inline: bool = False  # admitted to run in the caller's thread, in Batcher.result
    queue_s: float = 0.0
    compute_s: float = 0.0
    batch_size: int = 0
    trace: object | None = None  # the caller's, handed to the batcher's tracer (BatchTracer) untouched


class Batcher:
    """Queue requests for one loaded model version and run them in dynamic batches."""

    def __init__(
        self,
        run: RunBatch,
        spec: ModelSpec,
        *,
        max_batch_size: int,
        max_queue_delay_s: float,
        max_queue_size: int,
        combine: bool = True,
        preferred_batch_sizes: tuple[int, ...] = (),
        instances: int = 1,
        observer: BatchObserver | None = None,
        tracer: BatchTracer | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
        input_sample_every: int = 0,
        batch_limits: Mapping[int, int] | None = None,
        run_alone: RunBatch | None = None,
        cores: CoreClaim | None = None,
    ) -> None:
        self._run = run
        # A session that may use every core, for a batch that runs with nothing else running or queued (an idle
        # server's lone request); None: every batch runs on `run`, whose intra-op threads share the cores.
        self._run_alone = run_alone
        # The node's claim on its cores (serving.cores): every run takes it, so that a lone run, here or in another
        # worker, has them to itself; None: no claim (a GPU session; or no lone session here and none given).
        self._cores = cores or (CoreClaim() if run_alone is not None else None)
        self._spec = spec
        self.max_batch_size = max(1, max_batch_size)
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        # combine=False runs each request alone (batching off), still honouring its own batch axis.
        self.combine = combine
        # Triton's preferred_batch_size: sizes worth dispatching before the delay, smallest first.
        self.preferred_batch_sizes = tuple(sorted({n for n in preferred_batch_sizes if n > 0}))
        # Per sequence bucket, the largest batch requests are merged into (serving.batchcost); none: max_batch_size.
        self.batch_limits: dict[int, int] = dict(batch_limits or {})
        self._observer = observer
        self._tracer = tracer
        self._clock = clock
        self._queue: list[Pending] = []
        self._queued_samples = 0
        self._running = 0  # batches running: in executors and inline in callers' threads
        self._instances = max(1, instances)
        self._idle_waiters = 0  # callers of wait_idle and close, woken when the last run ends
        # Requests in a row that found nothing queued or running; callers run inline only after
        # INLINE_AFTER of them, so one burst of load goes back to batching in the executors.
        self._idle_arrivals = INLINE_AFTER
        self._closing = False
        self._cond = threading.Condition()
        self._per_sample_s = 0.0  # moving average, for Retry-After
        # Queue depth over time since the last snapshot: its max and its time integral.
        self._depth_max = 0
        self._depth_area = 0.0
        self._created_at = self._depth_since = self._window_start = clock()
        self._stats = BatcherStats()
        # One successful request in `input_sample_every` has its numeric inputs summarised (0: none).
        self._input_sample_every = max(0, input_sample_every)
        self._input_ticks = itertools.count()
        self._threads = [
            threading.Thread(target=self._loop, name=f"batcher-{name}-{i}", daemon=True) for i in range(self._instances)
        ]
        for i, thread in enumerate(self._threads):
            thread.start()
            name_in_kernel(thread, executor_name(name, i))  # NOTE: top -H and py-spy tell executors from the loop

    # -- callers -------------------------------------------------------------------------

    @property
    def stats(self) -> BatcherStats:
        """Return a copy of the cumulative counters, consistent with itself (taken under the lock)."""
        # NOTE: executor threads update several counters per batch; a copy made under the same lock
        # never shows a batch half counted (e.g. success + failed != the latency histogram's total).
        with self._cond:
            return self._stats.copy()

    def record_codec(self, decode_ns: int, encode_ns: int) -> None:
        """Count one successful request's protocol decode and encode time (the transport measures them)."""
        with self._cond:
            self._stats.decoded += 1
            self._stats.decode_ns += decode_ns
            self._stats.encoded += 1
            self._stats.encode_ns += encode_ns

    def record_refused(self, kind: str) -> None:
        """Count a request this version refused for its own input before it ran: a client error of `kind`.

        As Triton counts a request that fails validation in its `fail` statistics; the history and the
        metrics see it as a client error, with its kind.
        """
        with self._cond:
            self._stats.failed += 1
            self._stats.client_errors += 1
            self._stats.client_error_kinds[kind] = self._stats.client_error_kinds.get(kind, 0) + 1
        if self._observer:
            self._observer.request_refused(kind)

    @property
    def queue_depth(self) -> int:
        """Return the number of samples waiting (not yet running)."""
        return self._queued_samples

    @property
    def busy(self) -> bool:
        """Return whether anything is queued or running."""
        with self._cond:
            return bool(self._queue) or self._running > 0

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until nothing is queued or running (callbacks on finished requests included)."""
        with self._cond:
            self._idle_waiters += 1
            try:
                return self._cond.wait_for(lambda: not self._queue and self._running == 0, timeout_s)
            finally:
                self._idle_waiters -= 1

    def submit(
        self,
        tensors: dict[str, np.ndarray],
        batch: int,
        seq_len: int,
        timeout_s: float,
        *,
        caller_runs: bool = False,
        on_done: Callable[[Pending], None] | None = None,
        trace: object | None = None,
    ) -> Pending:
        """Admit a validated request or refuse it at once (Overloaded / Unavailable).

        With `caller_runs`, the caller promises to call `result`, which then runs the request itself
        when it found nothing queued or running, as had the `INLINE_AFTER` requests before it.
        With `on_done`, the request is always queued and `on_done(pending)` is called once it is
        answered (in an executor's thread, or the thread that expired it); `answer_of` then reads the
        answer. It must not block: an event loop passes one that only schedules its own wake-up.
        `trace` is handed, with the others of its batch, to the batcher's tracer once the batch ran.
        """
        now = self._clock()
        if batch > self.max_batch_size:
            raise InvalidInput(
                f"batch size {batch} is over the limit of {self.max_batch_size} for '{self._spec.name}'", "batch_size"
            )
        with self._cond:
            if self._closing:
                raise Unavailable("the engine is draining and admits no new requests", retry_after=1)
            if self._queued_samples + batch > self.max_queue_size:
                self._stats.rejected += 1
                retry = math.ceil((self._queued_samples * self._per_sample_s) or 1)
                if self._observer:
                    self._observer.request_done(RequestOutcome.REJECTED, 0.0, 0.0, 0.0)
                raise Overloaded(
                    f"queue for '{self._spec.name}' version {self._spec.version} is full "
                    f"({self._queued_samples} of {self.max_queue_size} samples waiting)",
                    retry_after=retry,
                )
            pending = Pending(tensors, batch, seq_len, now, now + timeout_s, trace=trace)
            idle = not self._queue and not self._running
            self._idle_arrivals = self._idle_arrivals + 1 if idle else 0
            if caller_runs and on_done is None and idle and self._idle_arrivals > INLINE_AFTER:
                # NOTE: what an idle executor would have done at once, without the two thread hand-offs
                # (nor a Future: the answer stays in this thread).
                pending.state, pending.inline = _State.RUNNING, True
                self._running += 1
                return pending
            pending.group = group_key(self._spec, tensors, self._spec.bucket_of(seq_len))
            if on_done is None:
                pending.future = Future()
            else:
                pending.on_done = on_done
            self._depth_changing(now)
            self._queue.append(pending)
            self._queued_samples += batch
            self._depth_max = max(self._depth_max, self._queued_samples)
            depth = self._queued_samples
            self._cond.notify()
        if self._observer:
            self._observer.queue_changed(depth)
        return pending

    def result(self, pending: Pending) -> dict[str, np.ndarray]:
        """Wait for a request's outputs; a request still queued at its deadline is never run."""
        if pending.inline:
            try:
                if self._clock() >= pending.deadline:  # as an executor would: past its deadline, never run
                    with self._cond:
                        self._expire(pending)
                else:
                    self._execute([pending], alone=True)  # admitted with nothing queued or running
            finally:
                with self._cond:
                    self._running -= 1
                    # NOTE: waking idle executors for nothing would cost more CPU than the hand-off saved.
                    if self._queue or self._idle_waiters:
                        self._cond.notify_all()
            answer = pending.answer
            if isinstance(answer, ServingError):
                raise answer
            assert answer is not None  # _execute or _expire answered it before `_running` dropped
            return answer
        future = pending.future
        assert future is not None  # every queued request has one (submit)
        try:
            return future.result(timeout=max(0.0, pending.deadline - self._clock()))
        except FutureTimeout:
            self.expire_if_queued(pending)
        # Either expired just now, or already running: running requests finish.
        return future.result()

    def answer_of(self, pending: Pending) -> dict[str, np.ndarray]:
        """Return the outputs of a request submitted with `on_done`, or raise its error; only after `on_done`."""
        answer = pending.answer
        if isinstance(answer, ServingError):
            raise answer
        if answer is None:
            raise RuntimeError("answer_of called before the request was answered")
        return answer

    def expire_if_queued(self, pending: Pending) -> None:
        """At a request's deadline: answer it DeadlineExceeded if it is still queued (a running one finishes)."""
        with self._cond:
            if pending.state is _State.QUEUED:
                self._remove(pending)
                self._expire(pending)

    def reconfigure(
        self,
        *,
        max_batch_size: int,
        max_queue_delay_s: float,
        max_queue_size: int,
        batch_limits: Mapping[int, int] | None = None,
    ) -> int:
        """Change the batch, delay and queue limits at once, under the lock; return how many requests it refused.

        `batch_limits` (per sequence bucket, the largest merged batch) replaces the current ones when given.

        Waiting executors wake and apply the new delay and batch size to what is queued. A queue
        already over a lowered `max_queue_size` keeps what it accepted (new requests are refused
        until it drains). A queued request larger than a lowered `max_batch_size` could never leave
        the queue, so it is refused now (InvalidInput, counted as rejected) and never run.
        """
        if max_batch_size < 1 or max_queue_size < 1 or not max_queue_delay_s >= 0:
            raise ValueError(
                f"batching limits must be max_batch_size >= 1, max_queue_delay >= 0, max_queue_size >= 1; got "
                f"{max_batch_size}, {max_queue_delay_s}, {max_queue_size}"
            )
        with self._cond:
            self.max_batch_size = max_batch_size
            self.max_queue_delay_s = max_queue_delay_s
            self.max_queue_size = max_queue_size
            if batch_limits is not None:
                self.batch_limits = dict(batch_limits)
            too_large = [p for p in self._queue if p.batch > max_batch_size]
            for pending in too_large:
                self._remove(pending)
                pending.state = _State.DONE
                self._stats.rejected += 1
                _answer(
                    pending,
                    InvalidInput(
                        f"batch size {pending.batch} is over the limit of {max_batch_size} for '{self._spec.name}', "
                        "lowered while the request waited; it was not run"
                    ),
                )
            depth = self._queued_samples
            self._cond.notify_all()
        if self._observer:
            for _ in too_large:
                self._observer.request_done(RequestOutcome.REJECTED, 0.0, 0.0, 0.0)
            if too_large:
                self._observer.queue_changed(depth)
        return len(too_large)

    def close(self, timeout_s: float | None = None) -> bool:
        """Stop admitting, finish everything accepted, stop the executors; return whether all finished."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._cond:  # inline runs in callers' threads finish too
            self._idle_waiters += 1
            idle = self._cond.wait_for(
                lambda: self._running == 0, None if deadline is None else max(0.0, deadline - time.monotonic())
            )
            self._idle_waiters -= 1
        return idle and not any(t.is_alive() for t in self._threads)

    # -- executors -----------------------------------------------------------------------

    def _loop(self) -> None:
        fresh = True
        while True:
            with self._cond:
                # NOTE: a request queued before this executor first looked found the batcher idle too, if nothing ran
                batch = self._next_batch(idle=fresh and not self._running)
                fresh = False
                if batch is None:
                    return
                # NOTE: one request, not a merged batch: merging means load, where the cores pay more shared out.
                alone = not self._running and not self._queue and len(batch) == 1
                self._running += 1
            try:
                self._execute(batch, alone)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def _next_batch(self, idle: bool = False) -> list[Pending] | None:
        """Block until a batch is due (caller holds the lock); None when closed and empty.

        `idle`: the queue's oldest request came while nothing ran (as when this executor waited on an empty queue).
        """
        was_idle = idle
        while True:
            now = self._clock()
            self._expire_overdue(now)
            if not self._queue:
                if self._closing:
                    return None
                was_idle = True
                self._cond.wait()
                continue
            if self._running >= self._instances:
                # Inline runs hold every instance: wait as a busy executor would, then batch what gathered.
                was_idle = False
                self._cond.wait()
                continue
            groups: dict[GroupKey, list[Pending]] = {}
            for pending in self._queue:  # FIFO, so each group's members and the groups keep arrival order
                groups.setdefault(pending.group, []).append(pending)
            oldest = self._queue[0]
            head = groups[oldest.group]
            due = oldest.enqueued_at + self.max_queue_delay_s
            if not self.combine or was_idle or self._closing or now >= due:
                return self._take(head, self._room(oldest.group))
            # NOTE: before the oldest is due, any group may leave full or at a preferred size; it never
            # delays the oldest group past its due time, which is checked first on every wake-up.
            for key, members in groups.items():
                room = self._room(key)
                if sum(p.batch for p in members) >= room:
                    return self._take(members, room)
            for key, members in groups.items():
                preferred = self._preferred_size(members, self._room(key))
                if preferred:
                    return self._take(members, preferred)
            earliest_deadline = min(p.deadline for p in self._queue)
            self._cond.wait(max(0.0, min(due, earliest_deadline) - now))

    def _room(self, group: GroupKey | None) -> int:
        """Return the largest batch a group's requests are merged into: its bucket's cost-curve limit, or the max."""
        limit = limit_for(self.batch_limits, group[0]) if self.batch_limits and group is not None else None
        return self.max_batch_size if limit is None else max(1, min(limit, self.max_batch_size))

    def _preferred_size(self, members: list[Pending], room: int) -> int:
        """Return the largest preferred batch size up to `room` the group's queue order reaches exactly (0: none)."""
        sizes = [n for n in self.preferred_batch_sizes if n <= room]
        best = total = 0
        for pending in members:
            total += pending.batch
            if total > room:
                break
            if total in sizes:
                best = total
        return best

    def _take(self, members: list[Pending], room: int) -> list[Pending]:
        taken: list[Pending] = []
        for pending in members:
            # NOTE: the first always goes: a request larger than its bucket's cost-curve limit (never than
            # max_batch_size: submit refuses those) runs alone rather than never.
            if pending.batch <= room or not taken:
                taken.append(pending)
                room -= pending.batch
                if room <= 0 or not self.combine:
                    break
        for pending in taken:
            self._remove(pending)
            pending.state = _State.RUNNING
        if self._observer:
            self._observer.queue_changed(self._queued_samples)
        return taken

    def _remove(self, pending: Pending) -> None:
        self._depth_changing(self._clock())
        self._queue.remove(pending)
        self._queued_samples -= pending.batch

    def _depth_changing(self, now: float) -> None:
        """Account for the time the queue spent at its current depth (caller holds the lock)."""
        self._depth_area += self._queued_samples * (now - self._depth_since)
        self._depth_since = now

    def zero_snapshot(self) -> BatcherSnapshot:
        """Return the counters as they stood when this batcher was created (all zero)."""
        return BatcherSnapshot(
            taken_at=self._created_at,
            success=0,
            failed=0,
            client_errors=0,
            bisect_runs=0,
            timeouts=0,
            rejected=0,
            execution_count=0,
            real_tokens=0,
            padded_tokens=0,
            batch_counts={},
            latency=Histogram(),
            latency_sum_s=0.0,
            queue_depth_max=0,
            queue_depth_mean=0.0,
        )

    def snapshot(self) -> BatcherSnapshot:
        """Return the cumulative counters and start a new queue-depth window (one reader: the sampler)."""
        with self._cond:
            now = self._clock()
            self._depth_changing(now)
            s = self._stats
            window = now - self._window_start
            snap = BatcherSnapshot(
                taken_at=now,
                success=s.success,
                failed=s.failed,
                client_errors=s.client_errors,
                bisect_runs=s.bisect_runs,
                timeouts=s.timeouts,
                rejected=s.rejected,
                execution_count=s.execution_count,
                real_tokens=s.real_tokens,
                padded_tokens=s.padded_tokens,
                batch_counts={size: count for size, (count, _) in s.batch_sizes.items()},
                latency=s.latency.copy(),
                latency_sum_s=(s.success_ns + s.failed_ns) / 1e9,
                queue_depth_max=self._depth_max,
                queue_depth_mean=self._depth_area / window if window > 0 else float(self._queued_samples),
                client_error_kinds=dict(s.client_error_kinds),
                compute={size: h.copy() for size, h in s.compute.items()},
                labels={output: dict(counts) for output, counts in s.labels.items()},
                inputs=inputstats.copy(s.inputs),
            )
            self._depth_max = self._queued_samples
            self._depth_area = 0.0
            self._window_start = now
            return snap

    def _expire_overdue(self, now: float) -> None:
        for pending in [p for p in self._queue if p.deadline <= now]:
            self._remove(pending)
            self._expire(pending)

    def _expire(self, pending: Pending) -> None:
        pending.state = _State.DONE
        self._stats.timeouts += 1
        waited = self._clock() - pending.enqueued_at
        _answer(
            pending,
            DeadlineExceeded(f"deadline passed after {waited * 1000:.0f} ms in the queue; the request was not run"),
        )
        if self._observer:
            self._observer.request_done(RequestOutcome.TIMEOUT, waited, 0.0, waited)
            self._observer.queue_changed(self._queued_samples)

    def _execute(self, batch: list[Pending], alone: bool = False) -> None:
        start = self._clock()
        size = sum(p.batch for p in batch)
        parts = [Part(p.tensors, p.batch, p.seq_len) for p in batch]
        lone = False  # whether it ran on the lone-request session, with every core
        if self._cores is None:
            isolated = run_isolated(self._run, self._spec, parts)
        else:
            with self._cores.hold(every=alone and self._run_alone is not None) as lone:
                isolated = run_isolated(self._run_alone if lone else self._run, self._spec, parts)
        results: dict[Pending, dict[str, np.ndarray] | ServingError] = {}
        for i, pending in enumerate(batch):
            result = isolated.results[i]
            results[pending] = self._error(result) if isinstance(result, Exception) else result
        end = self._clock()
        compute = end - start
        self._per_sample_s = 0.8 * self._per_sample_s + 0.2 * (compute / size) if self._per_sample_s else compute / size
        for pending in batch:
            pending.queue_s = start - pending.enqueued_at
            pending.compute_s = compute
            pending.batch_size = size
            pending.state = _State.DONE
        # NOTE: count first, answer second, so a caller who reads the stats after its answer sees itself.
        self._record(batch, results, size, isolated, compute, end, lone)
        for pending in batch:
            _answer(pending, results[pending])
        if self._tracer is not None:  # NOTE: after the answers: no request waits for its batch's span
            self._trace(batch, results, size, compute, isolated.extra_runs)

    def _trace(
        self,
        batch: list[Pending],
        results: dict[Pending, dict[str, np.ndarray] | ServingError],
        size: int,
        compute: float,
        extra_runs: int,
    ) -> None:
        traces = [p.trace for p in batch if p.trace is not None]
        if not traces:
            return
        try:
            self._tracer.batch_ran(traces, size, compute, [_outcome(results[p]) for p in batch], extra_runs)
        except Exception:  # a span must never fail a batch that was already answered
            log.exception("could not trace a batch of '%s' version %s", self._spec.name, self._spec.version)

    def _error(self, exc: Exception) -> ServingError:
        """Turn the failure of one request run alone into the error it answers with."""
        where = f"model '{self._spec.name}' version {self._spec.version}"
        if is_input_fault(exc):
            log.debug("%s refused a request's input: %s", where, type(exc).__name__)  # the request log has it
            return InputRejected(f"{where} refused the input: {trim(str(exc))}")
        log.error("%s failed on a request: %s", where, trim(str(exc)), exc_info=exc)
        return InferenceFailed(f"{where} failed: {trim(str(exc))}")

    def _record(
        self,
        batch: list[Pending],
        results: dict[Pending, dict[str, np.ndarray] | ServingError],
        size: int,
        isolated: Isolated,
        compute: float,
        end: float,
        lone: bool = False,
    ) -> None:
        real, padded = isolated.real_tokens, isolated.padded_tokens
        outcomes = {p: _outcome(results[p]) for p in batch}
        predicted: dict[tuple[str, object], int] = {}
        for p in batch:  # NOTE: outside the lock: an arg-max per answer, a few microseconds
            if outcomes[p] is RequestOutcome.SUCCESS:
                count_labels(results[p], predicted)  # type: ignore[arg-type]
        sampled = self._sample_inputs(batch, outcomes) if self._input_sample_every else None
        with self._cond:
            s = self._stats
            s.execution_count += 1
            s.lone_runs += lone
            s.bisect_runs += isolated.extra_runs
            s.compute_ns += int(compute * 1e9)
            per_size = s.batch_sizes.setdefault(size, [0, 0])
            per_size[0] += 1
            per_size[1] += int(compute * 1e9)
            s.compute.setdefault(size, Histogram()).record(compute)
            counted = add_bounded(s.labels, predicted) if predicted else None
            if sampled:
                inputstats.add_values(s.inputs, sampled)
            s.real_tokens += real
            s.padded_tokens += padded
            s.last_inference_ms = int(time.time() * 1000)
            for p in batch:
                total_ns = int((end - p.enqueued_at) * 1e9)
                s.latency.record(end - p.enqueued_at)
                s.queue_ns += int(p.queue_s * 1e9)
                if outcomes[p] is RequestOutcome.SUCCESS:
                    s.success += 1
                    s.success_ns += total_ns
                    s.inference_count += p.batch
                else:
                    s.failed += 1
                    s.failed_ns += total_ns
                    if outcomes[p] is RequestOutcome.CLIENT_ERROR:
                        s.client_errors += 1
                        kind = getattr(results[p], "kind", "runtime")
                        s.client_error_kinds[kind] = s.client_error_kinds.get(kind, 0) + 1
        if self._observer:
            self._observer.batch_done(size, real, padded, compute)
            if lone:
                lone_ran = getattr(self._observer, "lone_ran", None)  # NOTE: optional, as labels_done
                if lone_ran is not None:
                    lone_ran()
            if counted:
                labels_done = getattr(self._observer, "labels_done", None)
                if labels_done is not None:
                    labels_done(counted)
            for p in batch:
                self._observer.request_done(outcomes[p], p.queue_s, compute, end - p.enqueued_at)

    def _sample_inputs(self, batch: list[Pending], outcomes: dict) -> list[tuple[str, list[float]]]:
        """Features of the successful requests whose turn it is to be summarised (one in `input_sample_every`).

        NOTE: outside the lock; `next` on an itertools.count is atomic under the GIL, so executor threads
        share one count without a lock of their own.
        """
        found: list[tuple[str, list[float]]] = []
        try:
            for p in batch:
                if outcomes[p] is RequestOutcome.SUCCESS and next(self._input_ticks) % self._input_sample_every == 0:
                    found.extend(inputstats.features_of(p.tensors, p.batch))
        except Exception:  # a summary must never cost an answer: log once, stop summarising this version
            log.exception("summarising the inputs of '%s' failed; input drift is off for it", self._spec.name)
            self._input_sample_every = 0
            return []
        return found


def _answer(pending: Pending, result: dict[str, np.ndarray] | ServingError) -> None:
    """Hand a request its outputs or its error: through its future, its `on_done`, or to the caller running it inline."""
    if pending.future is None:
        pending.answer = result
        if pending.on_done is not None:
            pending.on_done(pending)
    elif isinstance(result, ServingError):
        pending.future.set_exception(result)
    else:
        pending.future.set_result(result)


def _outcome(result: dict[str, np.ndarray] | ServingError) -> RequestOutcome:
    if not isinstance(result, ServingError):
        return RequestOutcome.SUCCESS
    return RequestOutcome.CLIENT_ERROR if result.status < 500 else RequestOutcome.ERROR
