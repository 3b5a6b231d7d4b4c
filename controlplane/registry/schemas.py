"""The registry API's request and response models (`/api/models`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from controlplane.contract import Reply, Timestamp
from controlplane.registry.service import TAG_RE


class PushForm(BaseModel):
    """A model version to push, as multipart/form-data."""

    archive: bytes = Field(description="a tar.gz holding model.onnx and manifest.json")
    sha256: str | None = Field(default=None, description="refuse unless the archive has this SHA-256 (hex)")


class Tags(RootModel[list[str]]):
    """The version's tags, replacing the ones it has; a tag moves off the model's other versions."""

    model_config = ConfigDict(strict=True)

    root: list[str] = Field(json_schema_extra={"items": {"type": "string", "pattern": TAG_RE.pattern}})


class GoldenResult(Reply):
    samples: int = Field(description="golden samples the manifest declares")
    passed: bool | None = Field(description="whether the outputs matched at push (null: none declared)")


class VersionView(Reply):
    """One stored version."""

    name: str
    version: str
    sha256: str
    size_bytes: int
    pushed_by: str
    pushed_at: Timestamp
    tags: list[str]
    golden: GoldenResult
    description: str | None = None


class VersionDetail(VersionView):
    """One stored version with its manifest."""

    manifest: dict[str, Any]


class ModelVersions(Reply):
    name: str
    versions: list[VersionView]


class ModelList(Reply):
    models: list[ModelVersions]
