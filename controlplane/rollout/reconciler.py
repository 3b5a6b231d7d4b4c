"""The reconciler: makes this process's engine match the desired state in `deployments` and `engine_desired`.

Order keeps traffic flowing: load (and verify) what a slot should hold, then set the weights,
reload the slots asked for, then unload what no slot should hold. Inside one process it is woken
at once after a write. Other processes' writes: on SQLite, an inotify watch of the database's
folder wakes it when any commit lands, and a pass runs only when `PRAGMA data_version` says another
connection committed and the desired-state rows differ from those the last pass began with
(controlplane.desiredchanges), so an idle process does nearly nothing: the heartbeats and history rows
that commit every few seconds cost a read of two small tables, not a pass. Without inotify that
counter is read every poll. On PostgreSQL every node LISTENs for the NOTIFY that each
desired-state write sends in its transaction, and wakes at once; a pass (one small indexed read)
also runs every `safety_poll_s` in case a notification was lost, or every second where LISTEN is
unavailable. Engine-wide desired state (batching limits, memory compaction) is applied in the same
pass, batching first so versions loaded in that pass get the new limits; each process reports what
it applied in `engine_status` (and refreshes that row every heartbeat, FLIGHTDECK_HEARTBEAT_S, so
readers can tell a live process from one that went away: `controlplane.cluster`). A process that
stops removes its rows, so it is not listed as serving after it left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from controlplane import __version__
from controlplane.clock import utcnow
from controlplane.desiredchanges import ChangeSignal, DirectoryWatch, PostgresListener, postgres_url, sqlite_path
from controlplane.models import Deployment, EngineDesired, EngineStatus, SlotStatus
from controlplane.rollout.enginewide import BATCHING_LIMITS, effective_batching
from serving.engine import SLOTS, Engine, read_manifest

log = logging.getLogger(__name__)

Locate = Callable[[str, str], Path]
HEARTBEAT_S = 10.0  # engine_status.updated_at is refreshed at least this often (FLIGHTDECK_HEARTBEAT_S)
# With a directory watch: how long at most to keep polling the change counter after a wake-up (a commit
# lands a moment after its -wal write's inotify event; polling stops at the first quiet look after the
# counter moved), and how often to look when nothing woke us.
SETTLE_S = 0.2
WATCHED_POLL_S = 1.0
UNWATCHED_POLL_S = 1.0  # PostgreSQL without LISTEN: never read the tables more often than this while idle


class Reconciler:
    """Converge one engine to the desired state; `reconcile()` is safe to call from any thread."""

    def __init__(
        self,
        engine: Engine,
        sessions: sessionmaker[Session],
        locate: Locate,
        process: str,
        poll_s: float = 0.25,
        models: set[str] | None = None,
        on_changed: Callable[[], None] | None = None,
        safety_poll_s: float = 5.0,
        on_traffic_moved: Callable[[], None] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self._engine = engine
        self._sessions = sessions
        self._locate = locate
        self._process = process
        self._poll_s = poll_s
        self._safety_poll_s = safety_poll_s  # PostgreSQL with LISTEN: a pass at least this often anyway
        self.heartbeat_s = heartbeat_s  # how often engine_status is refreshed while nothing changes
        self._started_at = utcnow()
        self._models = models  # None: every deployment; else only these on this node (FLIGHTDECK_LOAD_MODELS)
        self._on_changed = on_changed  # after a pass that loaded, replaced or unloaded something
        # After a pass that changed a model's traffic weights: the history sampler, so the rows a rollout
        # step is judged on begin when its weights took effect here (controller._window).
        self._on_traffic_moved = on_traffic_moved
        self._moved = False
        self._traffic: dict[str, tuple] = {}  # model -> (weights, shadow slot) last applied
        # model -> (generation, updated_at) last applied. NOTE: updated_at too, because an undeploy and a new
        # first deploy between two polls restart the generation at 1, which alone could look already applied.
        self._applied: dict[str, tuple[int, object]] = {}
        # (model, slot, version) -> (the desired state it failed for, why). NOTE: remembered against that
        # desired state (generation, updated_at), never for ever: any later desired state that asks for the
        # version again (a new deploy, a reload) is tried again in every process, whichever took the call.
        self._failed: dict[tuple[str, str, str], tuple[tuple[int, object], str]] = {}
        self._reloads: dict[tuple[str, str], int] = {}  # (model, slot) -> reload counter last seen
        # Engine-wide desired state: what this process applied, and what it last wrote to engine_status.
        self._base_batching = engine.batching  # this process's own settings: what a null limit means
        self._engine_generation: int | None = None
        self._compact_generation: int | None = None
        self._batching_error = ""
        self._compact_error = ""
        self._compact_report: dict | None = None
        self._compactions = 0
        self._reported: tuple | None = None
        self._reported_at = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._asked = False  # wake() was called: a pass whatever the change counter says
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: DirectoryWatch | None = None
        self._listener: PostgresListener | None = None
        self._postgres = False  # set by start(): the desired state lives on a PostgreSQL server

    @property
    def process(self) -> str:
        """Return the name this process reports under in slot_status and engine_status."""
        return self._process

    def wake(self) -> None:
        """Ask for a pass now (called after this process wrote desired state)."""
        self._asked = True
        self._wake.set()

    def start(self) -> None:
        """Reconcile once, synchronously, then keep reconciling in a background thread."""
        # NOTE: the watch starts and the counter is read before the first pass, so a commit during it is seen.
        path = sqlite_path(self._sessions)
        signal = ChangeSignal(path) if path else None
        if signal is not None:
            signal.changed()
            self._watch = DirectoryWatch(os.path.dirname(os.path.abspath(path)), self._wake.set)
            if not self._watch.start():
                self._watch = None
        url = postgres_url(self._sessions)
        self._postgres = url is not None
        if url is not None:
            self._listener = PostgresListener(url, self._wake.set)
            if not self._listener.start():
                self._listener = None
        self.reconcile()
        self._engine.mark_converged()
        self._thread = threading.Thread(target=self._loop, args=(signal,), name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._watch is not None:
            self._watch.stop()
        if self._listener is not None:
            self._listener.stop()
        # A process that leaves stops counting as one that must apply engine-wide changes, and is no longer
        # listed as serving anything.
        try:
            with self._lock, self._sessions() as session:
                session.execute(delete(SlotStatus).where(SlotStatus.process == self._process))
                session.execute(delete(EngineStatus).where(EngineStatus.process == self._process))
                session.commit()
        except Exception:
            log.warning("could not remove this process's slot_status and engine_status rows", exc_info=True)

    def beat(self) -> None:
        """Refresh this process's heartbeat (engine_status.updated_at) alone, outside any pass.

        NOTE: run on a timer of its own (the scheduler's `heartbeat` job), so a pass that takes long (loading a
        large model) does not make a live process look gone. Before the first pass there is no row: nothing to do.
        """
        with self._sessions() as session:
            result = session.execute(
                update(EngineStatus).where(EngineStatus.process == self._process).values(updated_at=utcnow())
            )
            session.commit()
        if result.rowcount == 1:
            self._reported_at = time.monotonic()  # a pass need not write the row again for the heartbeat's sake

    def _timeout(self, settling: bool) -> float:
        """How long to wait for a wake-up before looking anyway."""
        beat = max(self.heartbeat_s / 2, 0.05)  # NOTE: never sleep through a heartbeat
        if self._listener is not None:
            return min(self._safety_poll_s, beat)
        if self._postgres:
            return min(max(self._poll_s, UNWATCHED_POLL_S), beat)
        return min(WATCHED_POLL_S if self._watch is not None and not settling else self._poll_s, beat)

    def _loop(self, signal: ChangeSignal | None) -> None:
        settle_until, landed, retry = 0.0, False, False
        applied: tuple | None = None  # the desired-state rows when the last pass began (SQLite only)
        try:
            while not self._stop.is_set():
                woken = self._wake.wait(self._timeout(time.monotonic() < settle_until))
                self._wake.clear()
                asked, self._asked = self._asked, False
                if self._stop.is_set():
                    return
                now = time.monotonic()
                if woken:
                    settle_until, landed = now + SETTLE_S, False
                committed = signal is None or signal.changed()  # NOTE: read every time, so a pass resets it
                if committed:
                    landed = True
                elif landed:
                    settle_until = 0.0  # the commit we were woken for is visible and nothing followed it
                changed = committed
                if committed and signal is not None:
                    rows = signal.fingerprint()
                    changed = rows is None or rows != applied
                    applied = rows  # NOTE: read before the pass: a write during it is seen at the next look
                # The engine_status heartbeat is due (the heartbeat job, where there is one, refreshes it first).
                due = now - self._reported_at >= self.heartbeat_s
                if not (asked or changed or due or retry):
                    continue
                retry = False
                try:
                    self.reconcile()
                except Exception:
                    retry = True
                    log.exception("reconcile pass failed; retrying on the next poll")
        finally:
            if signal is not None:
                signal.close()

    def reconcile(self) -> int:
        """Apply engine-wide changes, every deployment that changed, and every removal; return how many models."""
        with self._lock:
            with self._sessions() as session:
                engine_desired = session.get(EngineDesired, 1)
                self._apply_batching(engine_desired)
                deployments = [
                    d for d in session.scalars(select(Deployment)) if self._models is None or d.model in self._models
                ]
                gone = sorted(set(self._applied) - {d.model for d in deployments})
                for model in gone:
                    self._remove(session, model)
                changed = [d for d in deployments if self._applied.get(d.model) != (d.generation, d.updated_at)]
                for deployment in changed:
                    self._converge(session, deployment)
                    self._applied[deployment.model] = (deployment.generation, deployment.updated_at)
                self._apply_compaction(engine_desired)
                reported = self._report(session)
                if changed or gone or reported is not None:
                    session.commit()
                if reported is not None:
                    self._reported, self._reported_at = reported, time.monotonic()
                if (changed or gone) and self._on_changed is not None:
                    self._on_changed()
            moved, self._moved = self._moved, False
            # NOTE: after this pass's commit (its own connection is back), yet under the lock: whoever waits
            # on a pass (a test's settle) finds the row that marks the move already written.
            if moved and self._on_traffic_moved is not None:
                try:
                    self._on_traffic_moved()
                except Exception:
                    log.exception("could not mark the traffic move in the history")
            return len(changed) + len(gone)

    def _remove(self, session: Session, model: str) -> None:
        """Unload a model whose desired state is gone (undeployed), finishing what it accepted, and forget it."""
        for loaded in self._engine.loaded(model):
            self._engine.unload(model, loaded.slot)
        session.execute(delete(SlotStatus).where(SlotStatus.process == self._process, SlotStatus.model == model))
        self._applied.pop(model, None)
        self._traffic.pop(model, None)
        self._reloads = {k: v for k, v in self._reloads.items() if k[0] != model}
        self._failed = {k: v for k, v in self._failed.items() if k[0] != model}
        log.info("unloaded %s: it is no longer deployed", model)

    # -- engine-wide desired state -------------------------------------------------------

    def _apply_batching(self, desired: EngineDesired | None) -> None:
        """Give the engine the desired batching limits when their generation changed (null: our own setting)."""
        generation = desired.generation if desired is not None else 0
        if generation == self._engine_generation:
            return
        own = {key: getattr(self._base_batching, key) for key in BATCHING_LIMITS}
        limits = effective_batching(desired, own) if desired is not None else own
        try:
            self._engine.set_batching(**limits)
            self._batching_error = ""
        except Exception as exc:
            self._batching_error = f"could not apply batching generation {generation} {limits}: {exc}"
            log.error(self._batching_error)
        self._engine_generation = generation

    def _apply_compaction(self, desired: EngineDesired | None) -> None:
        """Compact memory once when compact_generation changed; a process just started only adopts it."""
        wanted = desired.compact_generation if desired is not None else 0
        if self._compact_generation is None or wanted == self._compact_generation:
            self._compact_generation = wanted  # NOTE: a fresh process has nothing to give back yet
            return
        try:
            self._compact_report = self._engine.compact_memory()
            self._compactions += 1
            self._compact_error = ""
            log.info("compacted memory (compact generation %d): %s", wanted, self._compact_report)
        except Exception as exc:
            self._compact_error = f"could not compact memory (compact generation {wanted}): {exc}"
            log.exception(self._compact_error)
        self._compact_generation = wanted

    def _report(self, session: Session) -> tuple | None:
        """Upsert this process's engine_status when it changed or is due a heartbeat; return what was written."""
        error = "; ".join(e for e in (self._batching_error, self._compact_error) if e)
        state = (self._engine_generation, self._compact_generation, error, self._compactions)
        if state == self._reported and time.monotonic() - self._reported_at < self.heartbeat_s:
            return None
        row = session.get(EngineStatus, self._process)
        if row is None:
            row = EngineStatus(process=self._process)
            session.add(row)
        # NOTE: every time: in a container a restarted process may have its predecessor's PID, and so its row.
        row.started_at, row.software_version = self._started_at, __version__
        row.generation, row.compact_generation = self._engine_generation or 0, self._compact_generation or 0
        row.error, row.report, row.updated_at = error, self._compact_report, utcnow()
        return state

    def _converge(self, session: Session, desired: Deployment) -> None:
        model = desired.model
        loaded = {v.slot: v for v in self._engine.loaded(model)}
        status: dict[str, tuple[str | None, str, str]] = {}
        reload: list[str] = []
        for slot, count in desired.reloads().items():
            seen = self._reloads.get((model, slot))
            self._reloads[(model, slot)] = count
            if seen is None or seen == count:
                continue  # NOTE: a process just started has loaded its versions fresh: nothing to reload
            want = desired.version_in(slot)
            if want is not None and slot in loaded and loaded[slot].spec.version == want:
                reload.append(slot)
        for slot in SLOTS:
            want = desired.version_in(slot)
            have = loaded[slot].spec.version if slot in loaded else None
            if want is None or want == have:
                status[slot] = (have, "loaded" if have else "empty", "")
                continue
            failed = self._failed.get((model, slot, want))
            if failed is not None and failed[0] == (desired.generation, desired.updated_at):
                why = failed[1]  # this very desired state failed here already (a pass retried after an error)
            else:
                why = self._load(model, slot, want, (desired.generation, desired.updated_at))
            status[slot] = (want, "failed", why) if why else (want, "loaded", "")
        live = {slot for slot, (_, state, _) in status.items() if state == "loaded" and status[slot][0]}
        weights = {
            slot: (w if slot in live and desired.version_in(slot) else 0) for slot, w in desired.weights().items()
        }
        if not any(weights.values()) and live:
            # NOTE: never leave a model with no traffic: fall back to the stable slot if it is live.
            fallback = desired.stable_slot if desired.stable_slot in live else sorted(live)[0]
            weights = {slot: 100 if slot == fallback else 0 for slot in SLOTS}
            log.error("desired weights for %s send traffic to no live slot; serving %s instead", model, fallback)
        if any(weights.values()):
            self._engine.set_weights(model, weights)
        if live:
            shadow = desired.shadow_slot if desired.shadow_slot in live else None
            self._engine.set_shadow(model, shadow)
            traffic = (tuple(sorted((str(k), v) for k, v in weights.items())), shadow)
            before = self._traffic.get(model)
            if before != traffic:
                # NOTE: not on a model's first pass here: its rows begin at its load anyway.
                self._traffic[model], self._moved = traffic, self._moved or before is not None
        for slot in reload:
            status[slot] = self._reload(model, slot, desired.version_in(slot), (desired.generation, desired.updated_at))
        for slot in SLOTS:
            if desired.version_in(slot) is None and slot in {v.slot for v in self._engine.loaded(model)}:
                self._engine.unload(model, slot)
                status[slot] = (None, "empty", "")
        now = utcnow()
        for slot, (version, state, error) in status.items():
            row = session.get(SlotStatus, (self._process, model, slot))
            if row is None:
                row = SlotStatus(process=self._process, model=model, slot=slot)
                session.add(row)
            row.version, row.state, row.error = version, state, error
            row.generation, row.updated_at = desired.generation, now

    def _load(self, model: str, slot: str, version: str, desired: tuple[int, object] = (0, None)) -> str:
        """Load and verify one version into a slot; return '' or why it failed (and unload it).

        A failure is remembered against `desired` (generation, updated_at) only: see `_failed`.
        """
        self._failed.pop((model, slot, version), None)
        from serving.golden import check_golden

        try:
            folder = self._locate(model, version)
            loaded = self._engine.load(folder, slot)
        except Exception as exc:
            why = f"could not load {model} version {version} into {slot}: {exc}"
            log.error(why)
            self._failed[(model, slot, version)] = (desired, why)
            return why
        failures = check_golden(read_manifest(folder), loaded.session.run)
        if failures:
            self._engine.unload(model, slot)
            why = f"{model} version {version} failed its golden samples: {'; '.join(failures)}"
            log.error(why)
            self._failed[(model, slot, version)] = (desired, why)
            return why
        return ""

    def _reload(self, model: str, slot: str, version: str, desired: tuple[int, object]) -> tuple[str | None, str, str]:
        """Drain a slot and load and verify its version again (see Engine.reload); return its status."""
        why = ""

        def load() -> None:
            nonlocal why
            why = self._load(model, slot, version, desired)

        try:
            self._engine.reload(model, slot, load)
        except ValueError as exc:  # it takes traffic and the other slot is empty here: it keeps serving
            log.error("did not reload %s %s: %s", model, slot, exc)
            return version, "loaded", f"reload refused: {exc}"
        except Exception as exc:
            why = why or f"could not reload {model} version {version} in {slot}: {exc}"
            log.exception(why)
        if any(v.slot == slot and v.spec.version == version for v in self._engine.loaded(model)):
            if why:  # the load failed before replacing the session: the old one still serves
                self._failed.pop((model, slot, version), None)
                return version, "loaded", f"reload failed; the previous session still serves: {why}"
            log.info("reloaded %s version %s in %s", model, version, slot)
            return version, "loaded", ""
        return version, "failed", why or f"{model} {slot} is empty after its reload"
