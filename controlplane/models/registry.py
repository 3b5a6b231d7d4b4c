"""The model registry: one row per pushed model version (its files live under HOME/registry/)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.models import Base


class ModelVersion(Base):
    """An immutable model version: the archive's SHA-256 is its identity; only tags change."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64), index=True)  # hex digest of the pushed archive
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    manifest: Mapped[dict] = mapped_column(JSON)
    path: Mapped[str] = mapped_column(String(512))  # folder relative to HOME: registry/<name>/<version>
    pushed_by: Mapped[str] = mapped_column(String(128))
    pushed_at: Mapped[datetime]
    tags: Mapped[list] = mapped_column(JSON, default=list)
    golden_passed: Mapped[bool | None]  # None: the manifest holds no golden samples (a failing push is refused)
    description: Mapped[str] = mapped_column(Text, default="")
