"""Where the registry keeps a version's files: this disk (HOME/registry) or an S3-compatible bucket.

The registry validates a push in HOME/tmp, then hands the folder (model.onnx, manifest.json, external
data and the pushed archive.tar.gz) to its `Storage`, in this order:

- `publish(row, folder)` before the row is written: copy the files where every node can fetch them
  (S3: upload, and keep this node's cached copy; the local disk: nothing), so no database lock is
  held during an upload;
- `place(row, folder)` inside the row's transaction: what must happen under the row's lock (the
  local disk: move the folder into HOME/registry); returns how to undo it should the commit fail;
- `withdraw(row)` after a push that did not commit: remove what `publish` stored.

`removing(row)` wraps a delete's commit, `folder(row)` returns a local folder holding the version,
ready for `Engine.load`, and `prune(keep)` drops this node's copies of versions deleted elsewhere.
Without FLIGHTDECK_STORAGE_URL the local disk serves, exactly as before the setting existed
(`Registry.for_settings` picks). This module imports nothing heavy: `config` validates the URL
through it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.models import ModelVersion

# S3's bucket naming rules (3-63 characters: lower-case letters, digits, dots and hyphens), and a key
# prefix of "safe" characters in segments that are neither empty nor '.' or '..'.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX_SEGMENT_RE = re.compile(r"^[A-Za-z0-9!_.*'()-]+$")
URL_FORM = "s3://bucket or s3://bucket/prefix"


def remove_tree(folder: Path, scratch: Path) -> None:
    """Delete `folder`, first renamed into `scratch` (same file system): it vanishes from its name at once,
    and a process that loaded from it keeps its open files (Linux)."""
    trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=scratch))
    os.rename(folder, trash / "old")
    shutil.rmtree(trash, ignore_errors=True)


@dataclass(frozen=True)
class StorageUrl:
    """An object store location: a bucket and a key prefix (no leading or trailing slash; may be empty)."""

    bucket: str
    prefix: str

    def key(self, *parts: str) -> str:
        """Return the object key of `parts` under the prefix."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_storage_url(value: str) -> StorageUrl | None:
    """Parse FLIGHTDECK_STORAGE_URL: None for empty (the local disk), else the bucket and prefix; ValueError if bad."""
    if not value:
        return None
    if not value.startswith("s3://"):
        raise ValueError(f"must be empty (the local disk) or {URL_FORM}; only s3:// is supported")
    bucket, _, prefix = value.removeprefix("s3://").partition("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ValueError(
            f"bucket {bucket!r:.80} is not a valid S3 bucket name (3-63 of a-z, 0-9, '.', '-'): {URL_FORM}"
        )
    segments = prefix.strip("/").split("/") if prefix.strip("/") else []
    for segment in segments:
        if segment in (".", "..") or not _PREFIX_SEGMENT_RE.match(segment):
            raise ValueError(f"prefix segment {segment!r:.80} may hold only letters, digits and !_.*'()-: {URL_FORM}")
    return StorageUrl(bucket, "/".join(segments))


class Storage(ABC):
    """Where versions' files live; subclasses keep them on this disk or in an object store."""

    def publish(self, row: ModelVersion, folder: Path) -> None:  # noqa: B027 (optional hook)
        """Copy a validated version where every node can fetch it, before its row is written (default: nothing)."""

    @abstractmethod
    def place(self, row: ModelVersion, folder: Path) -> Callable[[], None]:
        """Give this node the version's files (inside the row's transaction); return how to undo it."""

    def withdraw(self, row: ModelVersion) -> None:  # noqa: B027 (optional hook)
        """Remove what `publish` stored for a push that did not commit (default: nothing)."""

    @abstractmethod
    def removing(self, row: ModelVersion) -> AbstractContextManager[None]:
        """Remove a deleted version's files around the delete's commit (the body); keep them if it fails."""

    @abstractmethod
    def folder(self, row: ModelVersion) -> Path:
        """Return a local folder holding the version's model.onnx and manifest.json, ready to load."""

    def prune(self, keep: set[str], wanted: set[str] | None = None) -> list[str]:
        """Drop this node's copies of versions not in `keep`, and unused ones not in `wanted`; return them (default: none)."""
        return []

    @abstractmethod
    def describe(self) -> str:
        """Say where versions are kept, for logs."""


class LocalStorage(Storage):
    """Versions in HOME/registry/<name>/<version>/ on this disk (the default)."""

    def __init__(self, home: Path) -> None:
        self._home = Path(home)

    @property
    def tmp(self) -> Path:
        return self._home / "tmp"

    def place(self, row: ModelVersion, folder: Path) -> Callable[[], None]:
        """Move the validated folder into HOME/registry (under the row's lock); the undo removes it."""
        final = self._home / row.path
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # left behind by a process that died between the move and the commit
            self._discard(final)
        os.rename(folder, final)
        return lambda: shutil.rmtree(final, ignore_errors=True)

    @contextmanager
    def removing(self, row: ModelVersion) -> Iterator[None]:
        """Move the version's folder aside for the commit; back if it fails, gone if it succeeds."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        folder = self.folder(row)
        trash = Path(tempfile.mkdtemp(prefix="delete-", dir=self.tmp))
        try:
            # NOTE: moved aside under the transaction's lock, and back if the commit fails.
            moved = folder.exists()
            if moved:
                os.rename(folder, trash / "version")
            try:
                yield
            except BaseException:
                if moved:
                    os.rename(trash / "version", folder)
                raise
        finally:
            shutil.rmtree(trash, ignore_errors=True)

    def folder(self, row: ModelVersion) -> Path:
        """Return HOME/<row.path>: the version's folder as pushed."""
        return self._home / row.path

    def describe(self) -> str:
        """Say where versions are kept, for logs."""
        return str(self._home / "registry")

    def _discard(self, folder: Path) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        remove_tree(folder, self.tmp)
