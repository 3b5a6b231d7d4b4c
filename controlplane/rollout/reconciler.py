"""The reconciler: makes this process's engine match the desired state in `deployments`.

Order keeps traffic flowing: load (and verify) what a slot should hold, then set the weights,
then unload what no slot should hold. Inside one process it is woken at once after a write;
other processes and nodes poll the generation counters, which is one small indexed read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.models import Deployment, SlotStatus
from controlplane.scheduler import utcnow
from serving.engine import SLOTS, Engine, read_manifest

log = logging.getLogger(__name__)

Locate = Callable[[str, str], Path]


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
        on_loaded: Callable[[str, str, str, str], None] | None = None,
    ) -> None:
        self._engine = engine
        self._sessions = sessions
        self._locate = locate
        self._process = process
        self._poll_s = poll_s
        self._models = models  # None: every deployment; else only these (FLIGHTDECK_LOAD_MODELS)
        self._on_loaded = on_loaded
        self._applied: dict[str, int] = {}
        self._failed: dict[tuple[str, str, str], str] = {}  # (model, slot, version) -> why; not retried by itself
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Ask for a pass now (called after this process wrote desired state)."""
        self._wake.set()

    def start(self) -> None:
        """Reconcile once, synchronously, then keep reconciling in a background thread."""
        self.reconcile()
        self._thread = threading.Thread(target=self._loop, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile()
            except Exception:
                log.exception("reconcile pass failed; retrying on the next poll")

    def reconcile(self) -> int:
        """Apply every deployment whose generation changed; return how many were applied."""
        with self._lock, self._sessions() as session:
            deployments = [
                d for d in session.scalars(select(Deployment)) if self._models is None or d.model in self._models
            ]
            changed = [d for d in deployments if self._applied.get(d.model) != d.generation]
            for deployment in changed:
                self._converge(session, deployment)
                self._applied[deployment.model] = deployment.generation
            if changed:
                session.commit()
            return len(changed)

    def _converge(self, session: Session, desired: Deployment) -> None:
        model = desired.model
        loaded = {v.slot: v for v in self._engine.loaded(model)}
        status: dict[str, tuple[str | None, str, str]] = {}
        for slot in SLOTS:
            want = desired.version_in(slot)
            have = loaded[slot].spec.version if slot in loaded else None
            if want is None or want == have:
                status[slot] = (have, "loaded" if have else "empty", "")
                continue
            why = self._failed.get((model, slot, want)) or self._load(model, slot, want)
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

    def _load(self, model: str, slot: str, version: str) -> str:
        """Load and verify one version into a slot; return '' or why it failed (and unload it)."""
        from serving.golden import check_golden

        try:
            folder = self._locate(model, version)
            loaded = self._engine.load(folder, slot)
        except Exception as exc:
            why = f"could not load {model} version {version} into {slot}: {exc}"
            log.error(why)
            self._failed[(model, slot, version)] = why
            return why
        failures = check_golden(read_manifest(folder), loaded.session.run)
        if failures:
            self._engine.unload(model, slot)
            why = f"{model} version {version} failed its golden samples: {'; '.join(failures)}"
            log.error(why)
            self._failed[(model, slot, version)] = why
            return why
        if self._on_loaded is not None:
            self._on_loaded(model, version, slot, loaded.provider)
        return ""

    def forget_failures(self, model: str) -> None:
        """Let a failed version be tried again (a person deployed it again)."""
        with self._lock:
            self._failed = {k: v for k, v in self._failed.items() if k[0] != model}
