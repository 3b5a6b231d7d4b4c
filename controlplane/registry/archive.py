"""Model archives: checking and unpacking untrusted ones safely, and packing our own deterministically.

An archive is a tar.gz holding `model.onnx` and `manifest.json` at its top level, plus any
external-data files the model names. Every member is checked (name, type, size, count) as its
header is read and before anything is written; only then is it unpacked, with tarfile's "data"
filter as a second line of defence. The decompressed stream is capped too, so a gzip bomb or a
huge tar header stops at the limit instead of filling memory or disk.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from controlplane.registry.checks import MANIFEST_FILE, MODEL_FILE, external_data_locations
from controlplane.registry.errors import InvalidArchive
from controlplane.registry.graph_manifest import manifest_from_graph

if TYPE_CHECKING:
    from controlplane.config import Settings

ARCHIVE_FILE = "archive.tar.gz"  # the pushed archive, kept beside what it unpacked to
_READ_CAP = 8 * 1024 * 1024  # no tar header (pax or GNU long name) is anywhere near this
_SLACK = 1024 * 1024  # room for tar headers, padding and end-of-archive blocks
_KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "folder"}


@dataclass(frozen=True)
class ArchiveLimits:
    """How large an archive may be, packed and unpacked (the FLIGHTDECK_MAX_ARCHIVE_* settings)."""

    max_archive_bytes: int = 1024**3
    max_files: int = 64
    max_unpacked_bytes: int = 4 * 1024**3

    @classmethod
    def from_settings(cls, settings: Settings) -> ArchiveLimits:
        """Read the limits from the settings."""
        return cls(settings.max_archive_bytes, settings.max_archive_files, settings.max_unpacked_bytes)


class _CappedStream:
    """The decompressed tar stream, refusing any read or seek past `limit` bytes and any huge single read."""

    def __init__(self, raw: gzip.GzipFile, limit: int) -> None:
        self._raw = raw
        self._limit = limit

    def _over(self) -> InvalidArchive:
        return InvalidArchive(f"archive unpacks to more than {self._limit} bytes of tar data")

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > _READ_CAP:
            raise InvalidArchive(f"archive holds a tar header of more than {_READ_CAP} bytes")
        if self._raw.tell() + size > self._limit:
            raise self._over()
        return self._raw.read(size)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._raw.tell() + offset
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or target > self._limit:
            raise self._over()
        return self._raw.seek(target)

    def tell(self) -> int:
        return self._raw.tell()

    def drain(self) -> None:
        """Read to the end, so gzip checks its CRC and length and trailing garbage shows."""
        while self._raw.read(min(_READ_CAP, self._limit - self._raw.tell() + 1)):
            if self._raw.tell() > self._limit:
                raise self._over()


def _member_name(member: tarfile.TarInfo) -> str:
    name = member.name
    if any(ord(c) < 32 or c == "\\" for c in name):
        raise InvalidArchive(f"archive member {name!r} has a control character or backslash in its name")
    if name.startswith("/"):
        raise InvalidArchive(f"archive member {name!r} has an absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise InvalidArchive(f"archive member {name!r} has a '..' component (path traversal)")
    return "/".join(p for p in parts if p not in ("", "."))


def _member_kind(member: tarfile.TarInfo, name: str) -> str:
    if member.issym() or member.islnk():
        kind = "symbolic" if member.issym() else "hard"
        raise InvalidArchive(f"archive member {name!r} is a {kind} link (to {member.linkname!r}); links are refused")
    if member.ischr() or member.isblk() or member.isfifo():
        raise InvalidArchive(f"archive member {name!r} is a device or FIFO; only files and folders are allowed")
    if member.type not in _KINDS:
        raise InvalidArchive(
            f"archive member {name!r} has tar type {member.type!r}; only files and folders are allowed"
        )
    return _KINDS[member.type]


def _checked_members(tar: tarfile.TarFile, limits: ArchiveLimits) -> list[tarfile.TarInfo]:
    # NOTE: each header is checked before the next is read, so an oversized member is refused
    # before its bytes are decompressed on the way to the next header.
    members: list[tarfile.TarInfo] = []
    kinds: dict[str, str] = {}
    total = 0
    while (member := tar.next()) is not None:
        if len(members) >= limits.max_files:
            raise InvalidArchive(f"archive holds more than {limits.max_files} entries (FLIGHTDECK_MAX_ARCHIVE_FILES)")
        name = _member_name(member)
        kind = _member_kind(member, name or ".")
        if not name:
            if kind != "folder":
                raise InvalidArchive("archive has a member named '.' that is not a folder")
            continue  # the archive's own top folder ("./")
        if name in kinds:
            raise InvalidArchive(f"archive holds {name!r} twice")
        if kind == "file":
            if member.size > limits.max_unpacked_bytes:
                raise InvalidArchive(
                    f"archive member {name!r} is {member.size} bytes, over the limit of "
                    f"{limits.max_unpacked_bytes} (FLIGHTDECK_MAX_UNPACKED_BYTES)"
                )
            total += member.size
            if total > limits.max_unpacked_bytes:
                raise InvalidArchive(
                    f"archive unpacks to more than {limits.max_unpacked_bytes} bytes (FLIGHTDECK_MAX_UNPACKED_BYTES)"
                )
        kinds[name] = kind
        members.append(member)
    _check_layout(kinds)
    return members


def _check_layout(kinds: dict[str, str]) -> None:
    for required in (MODEL_FILE, MANIFEST_FILE):
        if kinds.get(required) != "file":
            nested = sorted(n for n in kinds if n.endswith("/" + required))
            hint = f" (found {nested[0]!r}; it must be at the top level)" if nested else ""
            raise InvalidArchive(f"archive has no {required} at its top level{hint}")
    if ARCHIVE_FILE in kinds:
        raise InvalidArchive(f"archive may not hold {ARCHIVE_FILE!r} at its top level (the name is reserved)")
    for name in kinds:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if kinds.get(parent) == "file":
                raise InvalidArchive(f"archive member {name!r} lies inside {parent!r}, which is a file")


def _data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    # tarfile's own "data" filter first (a second line of defence), then plain modes: a folder
    # stored as 0000 must not make the version unreadable, or its temp folder undeletable.
    checked = tarfile.data_filter(member, dest)
    return checked.replace(mode=0o755 if checked.isdir() else 0o644, deep=False)


def extract_archive(archive: Path, parent: Path, limits: ArchiveLimits) -> Path:
    """Check an untrusted tar.gz member by member, then unpack it into a fresh folder under `parent`."""
    dest = Path(tempfile.mkdtemp(prefix="unpacked-", dir=parent))
    try:
        with open(archive, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            stream = _CappedStream(gz, limits.max_unpacked_bytes + limits.max_files * 4096 + _SLACK)
            try:
                with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
                    members = _checked_members(tar, limits)
                    stream.drain()
                    tar.errorlevel = 2
                    tar.extractall(dest, members=members, filter=_data_filter)
            except tarfile.FilterError as exc:
                raise InvalidArchive(f"archive refused by tarfile's data filter: {exc}") from None
            except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise InvalidArchive(f"archive is corrupt or truncated (not a readable tar.gz): {exc}") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def pack_archive(out_path: Path, manifest: Mapping[str, Any], files: Mapping[str, Path]) -> str:
    """Write a deterministic tar.gz of manifest.json plus `files` (archive name -> source); return its SHA-256.

    Members are sorted, owned by 0:0 with mode 0644 and mtime 0, and gzip carries no name or time,
    so the same inputs give the same bytes (with the same zlib).
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for name in sorted({MANIFEST_FILE, *files}):
                        info = tarfile.TarInfo(name)
                        info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
                        if name == MANIFEST_FILE:
                            info.size = len(manifest_bytes)
                            tar.addfile(info, io.BytesIO(manifest_bytes))
                            continue
                        with open(files[name], "rb") as source:  # follows links: only the contents go in
                            info.size = os.fstat(source.fileno()).st_size
                            tar.addfile(info, source)
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with open(out_path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def build_archive(
    onnx_path: Path,
    out_path: Path,
    *,
    name: str,
    version: str,
    sequence_inputs: Mapping[str, tuple[int, float]] | None = None,
    max_batch_size: int | None = None,
    sequence_buckets: Sequence[int] = (),
    golden: list[dict] | None = None,
    description: str = "",
    metadata: Mapping[str, Any] | None = None,
    batching: Mapping[str, Any] | None = None,
    warmup: list[dict] | None = None,
) -> str:
    """Pack an ONNX file, its external data and a manifest derived from its graph; return the SHA-256.

    `sequence_inputs` maps an input to its (sequence axis, pad value), e.g. {"input_ids": (1, 0)};
    `batching` and `warmup` are passed to graph_manifest.manifest_from_graph.
    """
    onnx_path = Path(onnx_path)
    model = onnx.load(str(onnx_path), load_external_data=False)
    manifest = manifest_from_graph(
        model,
        name=name,
        version=version,
        sequence_inputs=sequence_inputs or {},
        max_batch_size=max_batch_size,
        sequence_buckets=sequence_buckets,
        golden=golden,
        description=description,
        metadata=metadata,
        batching=batching,
        warmup=warmup,
    )
    files = {MODEL_FILE: onnx_path}
    for tensor, location in external_data_locations(model):
        parts = location.split("/")
        if location.startswith("/") or ".." in parts or not (onnx_path.parent / location).is_file():
            raise ValueError(f"tensor {tensor!r} names external data {location!r}, not a file beside {onnx_path.name}")
        files["/".join(p for p in parts if p not in ("", "."))] = onnx_path.parent / location
    return pack_archive(out_path, manifest, files)
