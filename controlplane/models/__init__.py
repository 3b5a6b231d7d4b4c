"""ORM models, one module per concept. Alembic owns the schema; these must match its head revision.

Importing this package imports every model module, so `Base.metadata` is complete for Alembic.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Dialect, MetaData, String
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


# NOTE: imported last, so each module can subclass Base; every table must be listed here.
from controlplane.models.alerting import (  # noqa: E402
    AlertEvent,
    AlertRecord,
    NotificationGroup,
    OutboxMessage,
    Receiver,
    SilenceRecord,
)
from controlplane.models.auth import ApiToken, AuditEvent, LoginFailure, LoginSession, User  # noqa: E402
from controlplane.models.history import DeviceSample, DriftReference, SlotSample  # noqa: E402
from controlplane.models.registry import ModelVersion  # noqa: E402
from controlplane.models.rollout import (  # noqa: E402
    Deployment,
    EngineDesired,
    EngineStatus,
    Rollout,
    RolloutMeasurement,
    SlotStatus,
)
from controlplane.models.runbook import RunbookRun  # noqa: E402

__all__ = [
    "AlertEvent",
    "AlertRecord",
    "ApiToken",
    "AuditEvent",
    "Base",
    "Deployment",
    "DeviceSample",
    "DriftReference",
    "EngineDesired",
    "EngineStatus",
    "Lease",
    "LoginFailure",
    "LoginSession",
    "ModelVersion",
    "NAMING_CONVENTION",
    "NotificationGroup",
    "OutboxMessage",
    "Receiver",
    "Rollout",
    "RolloutMeasurement",
    "RunbookRun",
    "SilenceRecord",
    "SlotSample",
    "SlotStatus",
    "User",
    "UtcDateTime",
]
