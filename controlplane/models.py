"""ORM models. Alembic owns the schema; these declarations must match its head revision."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Dialect, Index, MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """An aware datetime stored in UTC everywhere.

    SQLite keeps no offset and compares timestamps as text, so values are converted to UTC before
    they are stored or compared, and come back marked as UTC; PostgreSQL gets timestamptz.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given where an aware one is needed")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime()}


class Lease(Base):
    """A named, expiring lock: the holder of 'scheduler' runs cluster-wide jobs."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]
    acquired_at: Mapped[datetime]


class SlotSample(Base):
    """What one process's slot did over one interval (raw), or a rollup of such rows (process '*')."""

    __tablename__ = "slot_samples"
    __table_args__ = (
        Index("ix_slot_samples_model_ts", "model", "ts"),
        Index("ix_slot_samples_res_ts", "resolution_s", "ts"),
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
    errors: Mapped[int] = mapped_column(default=0)
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


class DeviceSample(Base):
    """Memory and utilisation of one device ('cpu' heap of a process, or 'gpu0', ...) at one moment."""

    __tablename__ = "device_samples"
    __table_args__ = (Index("ix_device_samples_res_ts", "resolution_s", "ts"),)

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
