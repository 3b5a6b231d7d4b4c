"""Desired state per model, rollouts and their measurements, and what each process really serves."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models import Base
from controlplane.rollout.states import Slot


class Deployment(Base):
    """What a model's two slots should hold and how traffic splits between them (the desired state)."""

    __tablename__ = "deployments"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    blue_version: Mapped[str | None] = mapped_column(String(64))
    green_version: Mapped[str | None] = mapped_column(String(64))
    blue_weight: Mapped[int] = mapped_column(default=100)
    green_weight: Mapped[int] = mapped_column(default=0)
    stable_slot: Mapped[str] = mapped_column(String(8), default=Slot.BLUE.value)
    shadow_slot: Mapped[str | None] = mapped_column(String(8))
    # Bumped on every change: processes compare it with what they last applied.
    generation: Mapped[int] = mapped_column(default=1)
    updated_at: Mapped[datetime]
    # Bumped (with generation) to ask every process to drain and load its slot's version again.
    blue_reload: Mapped[int] = mapped_column(default=0, server_default="0")
    green_reload: Mapped[int] = mapped_column(default=0, server_default="0")

    def version_in(self, slot: str) -> str | None:
        """Return the version `slot` should hold, or None."""
        return self.blue_version if slot == Slot.BLUE else self.green_version

    def weights(self) -> dict[Slot, int]:
        """Return each slot's share of the traffic, in percent."""
        return {Slot.BLUE: self.blue_weight, Slot.GREEN: self.green_weight}

    def reloads(self) -> dict[Slot, int]:
        """Return each slot's reload counter."""
        return {Slot.BLUE: self.blue_reload, Slot.GREEN: self.green_reload}


class Rollout(Base):
    """One attempt to move a model from its stable version to a candidate."""

    __tablename__ = "rollouts"
    __table_args__ = (Index("ix_rollouts_model_state", "model", "state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    from_version: Mapped[str | None] = mapped_column(String(64))
    to_version: Mapped[str] = mapped_column(String(64))
    candidate_slot: Mapped[str] = mapped_column(String(8))  # a Slot
    strategy: Mapped[str] = mapped_column(String(16))  # a Strategy: canary | bluegreen | rollback
    steps: Mapped[list] = mapped_column(JSON)  # traffic percentages, e.g. [5, 25, 50, 100]
    step_index: Mapped[int] = mapped_column(default=0)
    step_started_at: Mapped[datetime | None]
    pause_s: Mapped[float] = mapped_column(default=60.0)
    shadow: Mapped[bool] = mapped_column(default=False)
    policy: Mapped[dict] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))  # a RolloutState, written by rollout.lifecycle only
    reason: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class RolloutMeasurement(Base):
    """One analysis of one step: the verdict, why, and the figures behind it."""

    __tablename__ = "rollout_measurements"

    id: Mapped[int] = mapped_column(primary_key=True)
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"), index=True)
    step_index: Mapped[int]
    ts: Mapped[datetime]
    verdict: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[list] = mapped_column(JSON)
    figures: Mapped[dict] = mapped_column(JSON)
    # One entry per check: test, p-value or interval, effect sizes, sample sizes, floors, outcome.
    evidence: Mapped[list | None] = mapped_column(JSON)


class SlotStatus(Base):
    """What one serving process reports for one slot: the reconciler's side of the desired state."""

    __tablename__ = "slot_status"

    process: Mapped[str] = mapped_column(String(128), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    slot: Mapped[str] = mapped_column(String(8), primary_key=True)
    version: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # loaded | failed | empty
    error: Mapped[str] = mapped_column(Text, default="")
    generation: Mapped[int] = mapped_column(default=0)
    updated_at: Mapped[datetime]


class EngineDesired(Base):
    """Engine-wide desired state, one row (id 1): batching limits and memory compaction requests.

    A null limit means each process keeps its own setting. `generation` is bumped when the limits
    change, `compact_generation` when a compaction is asked for; every process's reconciler acts on
    a change and reports it in `engine_status`.
    """

    __tablename__ = "engine_desired"

    id: Mapped[int] = mapped_column(primary_key=True)
    generation: Mapped[int] = mapped_column(default=1)
    compact_generation: Mapped[int] = mapped_column(default=0)
    max_batch_size: Mapped[int | None]
    max_queue_delay_ms: Mapped[float | None]
    max_queue_size: Mapped[int | None]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(128), default="")


class EngineStatus(Base):
    """One serving process's heartbeat: what it last applied of the engine-wide desired state, its last
    compaction report, when it started and which Flightdeck it runs. `updated_at` is refreshed every
    heartbeat (FLIGHTDECK_HEARTBEAT_S); a process silent for three is shown as gone (`controlplane.cluster`).
    """

    __tablename__ = "engine_status"

    process: Mapped[str] = mapped_column(String(128), primary_key=True)
    generation: Mapped[int] = mapped_column(default=0)
    compact_generation: Mapped[int] = mapped_column(default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    report: Mapped[dict | None] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(index=True)
    started_at: Mapped[datetime | None]
    software_version: Mapped[str] = mapped_column(String(32), default="", server_default="")
