"""History rows: what each slot did per interval, and device memory readings."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models import Base


class SlotSample(Base):
    """What one process's slot did over one interval (raw), or a rollup of such rows (process '*')."""

    __tablename__ = "slot_samples"
    __table_args__ = (
        Index("ix_slot_samples_model_ts", "model", "ts"),
        Index("ix_slot_samples_res_ts", "resolution_s", "ts"),
        Index("ix_slot_samples_ts", "ts"),  # every model's rows in a window: slot-metric alert rules, charts
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    ts: Mapped[datetime]  # end of the interval
    resolution_s: Mapped[int]  # 0 for raw rows; 60 or 3600 for rollups
    interval_s: Mapped[float]
    process: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(64))
    slot: Mapped[str] = mapped_column(String(8))
    successes: Mapped[int] = mapped_column(default=0)
    errors: Mapped[int] = mapped_column(default=0)  # server errors: the model or the engine failed
    # Requests the model refused for their own input (a 400); never part of `errors`.
    client_errors: Mapped[int] = mapped_column(default=0, server_default="0")
    # ... by kind (serving.errors.CLIENT_ERROR_KINDS: shape, datatype, unknown_input, runtime...); None in rows
    # from before kinds were kept, whose client errors were all the runtime's.
    client_error_kinds: Mapped[dict | None] = mapped_column(JSON)
    timeouts: Mapped[int] = mapped_column(default=0)
    rejections: Mapped[int] = mapped_column(default=0)
    latency_hist: Mapped[dict] = mapped_column(JSON, default=dict)
    latency_sum_s: Mapped[float] = mapped_column(default=0.0)
    queue_depth_max: Mapped[int] = mapped_column(default=0)
    queue_depth_mean: Mapped[float] = mapped_column(default=0.0)
    batches: Mapped[int] = mapped_column(default=0)
    batch_sizes: Mapped[dict] = mapped_column(JSON, default=dict)
    real_tokens: Mapped[int] = mapped_column(default=0)
    padded_tokens: Mapped[int] = mapped_column(default=0)
    shadow_compared: Mapped[int] = mapped_column(default=0, server_default="0")  # copies of live requests answered
    shadow_agreed: Mapped[int] = mapped_column(default=0, server_default="0")  # ... matching the live version
    # {batch size: latency-histogram counts} of batch compute time: the canary judge compares like with like.
    compute_hist: Mapped[dict | None] = mapped_column(JSON)
    # {output: {label: count}} of predicted labels (arg-max of a classifier's scores, or a label output).
    label_counts: Mapped[dict | None] = mapped_column(JSON)
    # {feature: {n, sum, sumsq, bins}} of sampled numeric inputs (serving.inputstats): input drift.
    input_summaries: Mapped[dict | None] = mapped_column(JSON)


class DriftReference(Base):
    """The window an operator pinned as a version's reference for drift (without a row: its first day serving)."""

    __tablename__ = "drift_references"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    start: Mapped[datetime]
    end: Mapped[datetime]
    pinned_by: Mapped[str] = mapped_column(String(128))
    pinned_at: Mapped[datetime]


class DeviceSample(Base):
    """Memory and utilisation of one device ('cpu' heap of a process, or 'gpu0', ...) at one moment."""

    __tablename__ = "device_samples"
    __table_args__ = (Index("ix_device_samples_res_ts", "resolution_s", "ts"), Index("ix_device_samples_ts", "ts"))

    id: Mapped[int] = mapped_column(primary_key=True)
    ts: Mapped[datetime]
    resolution_s: Mapped[int]
    interval_s: Mapped[float]
    process: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(128), default="")
    utilization: Mapped[float | None]
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    in_use_bytes: Mapped[int | None] = mapped_column(BigInteger)
    fragmentation: Mapped[float | None]
