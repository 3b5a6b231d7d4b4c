"""The registry service: push, list, show, tag and delete model versions.

A version's files (model.onnx, manifest.json, external data, and the pushed archive as
archive.tar.gz) are kept by a `Storage`: HOME/registry/<name>/<version>/ by default, or an
S3-compatible bucket every node shares (FLIGHTDECK_STORAGE_URL, see `storage`); its row in
`model_versions`. A push is received into HOME/tmp/push-*/, validated there, then stored and
recorded in one transaction, so a refused or failed push leaves no row, no files and nothing in
HOME/tmp.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import onnx
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.models import Deployment, ModelVersion
from controlplane.registry.archive import ARCHIVE_FILE, ArchiveLimits, extract_archive, pack_archive
from controlplane.registry.checks import (
    MANIFEST_FILE,
    MODEL_FILE,
    Progress,
    check_model,
    external_data_locations,
    no_progress,
    read_manifest,
)
from controlplane.registry.errors import ArchiveTooLarge, HashMismatch, InvalidArchive, RegistryError
from controlplane.registry.plainstore import list_models, list_versions
from controlplane.registry.storage import LocalStorage, Storage, parse_storage_url
from serving.engine import read_manifest as read_store_manifest

if TYPE_CHECKING:
    from controlplane.config import Settings

log = logging.getLogger(__name__)

TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_TAGS = 16
_CHUNK = 1024 * 1024
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

Deployed = Callable[[str, str], bool]
# audit(session, action, target, outcome, detail): adds an audit event to the change's transaction.
Audit = Callable[[Session, str, str, str, dict], None]


def never_deployed(name: str, version: str) -> bool:
    """Say no version is deployed (the default until rollouts provide the real answer)."""
    return False


def version_dict(row: ModelVersion, *, manifest: bool = False) -> dict[str, Any]:
    """Describe a version for the API and the CLI; the manifest only when asked."""
    golden = row.manifest.get("golden") or []
    data: dict[str, Any] = {
        "name": row.name,
        "version": row.version,
        "sha256": row.sha256,
        "size_bytes": row.size_bytes,
        "pushed_by": row.pushed_by,
        "pushed_at": row.pushed_at.isoformat(),
        "tags": list(row.tags),
        "golden": {"samples": len(golden), "passed": row.golden_passed},
        "description": row.description,
    }
    if manifest:
        data["manifest"] = row.manifest
    return data


class Registry:
    """Store immutable, validated model versions; each call runs in its own short session."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        home: Path,
        limits: ArchiveLimits | None = None,
        storage: Storage | None = None,
    ) -> None:
        self._sessions = sessions
        self._home = Path(home)
        self._limits = limits or ArchiveLimits()
        self._storage = storage or LocalStorage(self._home)

    @classmethod
    def for_settings(cls, sessions: sessionmaker[Session], settings: Settings) -> Registry:
        """Return the registry under settings.home with the archive limits and the storage the settings give."""
        limits = ArchiveLimits.from_settings(settings)
        return cls(sessions, settings.home, limits, _storage_for(settings, limits))

    @property
    def sessions(self) -> sessionmaker[Session]:
        """Return the session factory this registry writes through."""
        return self._sessions

    @property
    def root(self) -> Path:
        return self._home / "registry"

    @property
    def tmp(self) -> Path:
        return self._home / "tmp"

    @property
    def storage(self) -> Storage:
        """Return where this registry keeps versions' files."""
        return self._storage

    def folder(self, row: ModelVersion) -> Path:
        """Return a local folder holding a version's model.onnx and manifest.json (what Engine.load takes).

        With an object store this is the node's cached copy, verified (and fetched again if missing
        or damaged) first; StorageUnavailable says why none could be had.
        """
        return self._storage.folder(row)

    # -- push ----------------------------------------------------------------------------

    def push(
        self,
        source: BinaryIO | str | Path,
        actor: str,
        expected_sha256: str | None = None,
        audit: Audit | None = None,
        progress: Progress = no_progress,
    ) -> tuple[ModelVersion, bool]:
        """Validate and store an archive (a path or a binary file object); return (version, created).

        Pushing the same archive again returns the stored version with created=False; a different
        archive under an existing name and version is a Conflict. `audit` records 'model.push' in
        the same transaction as the row (and an 'error' event when the push is refused). `progress`
        hears of bytes hashed, the unpacking, checks done and golden samples run (the CLI's bar).
        """
        found: dict[str, Any] = {}
        try:
            return self._push(source, actor, expected_sha256, audit, found, progress)
        except ApiError as exc:
            target = f"{found['name']}/{found['version']}" if "name" in found else ""
            detail = {k: v for k, v in found.items() if k in ("sha256", "size_bytes")}
            self._audit_failure(audit, "model.push", target, {**detail, "error": exc.message})
            raise

    def _push(
        self,
        source: BinaryIO | str | Path,
        actor: str,
        expected_sha256: str | None,
        audit: Audit | None,
        found: dict[str, Any],
        progress: Progress,
    ) -> tuple[ModelVersion, bool]:
        expected = None if expected_sha256 is None else expected_sha256.strip().lower()
        if expected is not None and not _SHA256_RE.match(expected):
            raise RegistryError(f"expected sha256 must be 64 hex digits, not {expected_sha256!r:.80}")
        self.tmp.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="push-", dir=self.tmp))
        try:
            upload = work / ARCHIVE_FILE
            found["sha256"], found["size_bytes"] = digest, size = self._receive(source, upload, progress)
            if expected is not None and expected != digest:
                raise HashMismatch(f"archive SHA-256 is {digest} but {expected} was expected")
            with self._sessions() as session:
                same = session.scalars(select(ModelVersion).where(ModelVersion.sha256 == digest)).first()
                if same is not None:
                    if audit is not None:
                        audit(session, "model.push", f"{same.name}/{same.version}", "ok", _push_detail(same, False))
                        session.commit()
                    return same, False
            progress("unpacking", 0, 1)
            folder = extract_archive(upload, work, self._limits)
            progress("unpacking", 1, 1)
            manifest = read_manifest(folder)
            found["name"], found["version"] = manifest["name"], manifest["version"]
            self._refuse_existing(manifest["name"], manifest["version"], digest)
            golden = check_model(folder, manifest, progress)
            os.replace(upload, folder / ARCHIVE_FILE)
            return self._store(folder, manifest, digest, size, actor, golden, audit)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _audit_failure(self, audit: Audit | None, action: str, target: str, detail: dict) -> None:
        if audit is None:
            return
        with self._sessions() as session:
            audit(session, action, target, "error", detail)
            session.commit()

    def _receive(self, source: BinaryIO | str | Path, dest: Path, progress: Progress) -> tuple[str, int]:
        digest = hashlib.sha256()
        size = 0
        limit = self._limits.max_archive_bytes
        # A file's size is known up front; a stream's is not (0: the bar shows bytes only).
        total = os.path.getsize(source) if isinstance(source, str | Path) else 0
        with ExitStack() as stack:
            reader = stack.enter_context(open(source, "rb")) if isinstance(source, str | Path) else source
            out = stack.enter_context(open(dest, "wb"))
            while chunk := reader.read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise ArchiveTooLarge(f"archive is over the limit of {limit} bytes (FLIGHTDECK_MAX_ARCHIVE_BYTES)")
                digest.update(chunk)
                out.write(chunk)
                progress("hashing", size, total)
        if size == 0:
            raise InvalidArchive("archive is empty")
        return digest.hexdigest(), size

    def _refuse_existing(self, name: str, version: str, digest: str) -> None:
        with self._sessions() as session:
            existing = self._find(session, name, version)
        if existing is not None and existing.sha256 != digest:
            raise _conflict(existing, digest)

    def _store(
        self,
        folder: Path,
        manifest: dict,
        digest: str,
        size: int,
        actor: str,
        golden: bool | None,
        audit: Audit | None,
    ) -> tuple[ModelVersion, bool]:
        name, version = manifest["name"], manifest["version"]
        relative = Path("registry") / name / version  # the local folder (LocalStorage) under HOME
        description = manifest.get("description") or str(manifest.get("metadata", {}).get("description", ""))
        row = ModelVersion(
            name=name,
            version=version,
            sha256=digest,
            size_bytes=size,
            manifest=manifest,
            path=relative.as_posix(),
            pushed_by=actor,
            pushed_at=datetime.now(UTC),
            tags=[],
            golden_passed=golden,
            description=description[:4096],
        )
        # NOTE: uploaded before the row's lock is taken, so a long upload blocks no other writer;
        # object keys carry the SHA-256, so a racing push of other bytes cannot overwrite these.
        try:
            self._storage.publish(row, folder)
            stored = self._commit(row, folder, audit)
        except BaseException:
            self._withdraw_unless_stored(row)
            raise
        if stored[1]:
            log.info("registry: %s pushed %s version %s (sha256 %s, %d bytes)", actor, name, version, digest, size)
        return stored

    def _commit(self, row: ModelVersion, folder: Path, audit: Audit | None) -> tuple[ModelVersion, bool]:
        with self._sessions() as session:
            session.add(row)
            try:
                # NOTE: the flushed insert holds the (name, version) slot until commit (SQLite's write
                # lock, PostgreSQL's unique index), so only one pusher moves files into place at a time.
                session.flush()
            except IntegrityError:
                session.rollback()
                return self._after_race(row.name, row.version, row.sha256)
            if audit is not None:
                audit(session, "model.push", f"{row.name}/{row.version}", "ok", _push_detail(row, True))
            undo = self._storage.place(row, folder)
            try:
                session.commit()
            except BaseException:
                undo()
                raise
        return row, True

    def _withdraw_unless_stored(self, row: ModelVersion) -> None:
        """After a push that did not commit, remove its objects unless a committed row holds the same archive."""
        try:
            with self._sessions() as session:
                query = select(ModelVersion.id).where(ModelVersion.sha256 == row.sha256)
                if session.scalars(query).first() is None:
                    self._storage.withdraw(row)
        except Exception:
            log.warning("registry: could not remove what a failed push of %s stored", row.sha256, exc_info=True)

    def _after_race(self, name: str, version: str, digest: str) -> tuple[ModelVersion, bool]:
        with self._sessions() as session:
            existing = self._find(session, name, version)
        if existing is None:
            raise RegistryError(f"could not store {name} version {version}; push it again")
        if existing.sha256 != digest:
            raise _conflict(existing, digest)
        return existing, False

    # -- read ----------------------------------------------------------------------------

    def list(self, name: str | None = None) -> list[ModelVersion]:
        """Return versions, of one model or all, by name and then in the order they were pushed."""
        query = select(ModelVersion).order_by(ModelVersion.name, ModelVersion.id)
        if name is not None:
            query = query.where(ModelVersion.name == name)
        with self._sessions() as session:
            return list(session.scalars(query))

    def get(self, name: str, version: str) -> ModelVersion:
        """Return one version, or raise NotFound."""
        with self._sessions() as session:
            return self._require(session, name, version)

    def resolve(self, name: str, ref: str) -> ModelVersion:
        """Return the version named `ref`, or else the one tagged `ref`; raise NotFound."""
        with self._sessions() as session:
            row = self._find(session, name, ref)
            if row is None:
                row = next(
                    (
                        r
                        for r in session.scalars(select(ModelVersion).where(ModelVersion.name == name))
                        if ref in r.tags
                    ),
                    None,
                )
        if row is None:
            raise NotFound(f"model '{name}' has no version or tag '{ref}' in the registry")
        return row

    def prune_copies(self) -> list[str]:
        """Drop this node's cached copies of deleted versions, and of unused ones no deployment names; return their SHA-256s.

        A delete on another node leaves this node's copy; every node runs this at start and every
        FLIGHTDECK_CACHE_PRUNE_S (`cache-prune`), so a copy follows the registry within that time.
        """
        with self._sessions() as session:
            kept = set(session.scalars(select(ModelVersion.sha256)))
            named = {
                (d.model, v)
                for d in session.scalars(select(Deployment))
                for v in (d.blue_version, d.green_version)
                if v
            }
            wanted = {
                row.sha256
                for row in session.scalars(select(ModelVersion).where(ModelVersion.name.in_({m for m, _ in named})))
                if (row.name, row.version) in named
            }
        gone = self._storage.prune(kept, wanted)
        if gone:
            log.info(
                "registry: dropped %d cached copies of deleted or undeployed versions from %s",
                len(gone),
                self._storage.describe(),
            )
        return gone

    @staticmethod
    def _find(session: Session, name: str, version: str) -> ModelVersion | None:
        query = select(ModelVersion).where(ModelVersion.name == name, ModelVersion.version == version)
        return session.scalars(query).first()

    def _require(self, session: Session, name: str, version: str) -> ModelVersion:
        row = self._find(session, name, version)
        if row is None:
            raise NotFound(f"model '{name}' has no version '{version}' in the registry")
        return row

    # -- change --------------------------------------------------------------------------

    def tag(self, name: str, version: str, tags: Iterable[str], actor: str, audit: Audit | None = None) -> ModelVersion:
        """Set a version's tags; a tag names one version per model, so it moves off any other version."""
        try:
            return self._tag(name, version, list(tags), actor, audit)
        except ApiError as exc:
            self._audit_failure(audit, "model.tag", f"{name}/{version}", {"error": exc.message})
            raise

    def _tag(self, name: str, version: str, tags: list, actor: str, audit: Audit | None) -> ModelVersion:
        bad = [t for t in tags if not isinstance(t, str) or not TAG_RE.match(t)]
        if bad:
            raise RegistryError(f"tag(s) {bad!r:.200} must match {TAG_RE.pattern}")
        if len(set(tags)) > MAX_TAGS:
            raise RegistryError(f"a version may have at most {MAX_TAGS} tags, not {len(set(tags))}")
        wanted = sorted(set(tags))
        with self._sessions() as session:
            row = self._require(session, name, version)
            for other in session.scalars(select(ModelVersion).where(ModelVersion.name == name)):
                if other.id != row.id and set(other.tags) & set(wanted):
                    other.tags = [t for t in other.tags if t not in wanted]
            row.tags = wanted
            if audit is not None:
                audit(session, "model.tag", f"{name}/{version}", "ok", {"tags": wanted})
            session.commit()
        log.info("registry: %s tagged %s version %s %s", actor, name, version, wanted)
        return row

    def delete(
        self,
        name: str,
        version: str,
        actor: str,
        deployed: Deployed = never_deployed,
        audit: Audit | None = None,
    ) -> ModelVersion:
        """Delete a version's row and files; refused (Conflict) while `deployed(name, version)` says it is deployed."""
        try:
            return self._delete(name, version, actor, deployed, audit)
        except ApiError as exc:
            self._audit_failure(audit, "model.delete", f"{name}/{version}", {"error": exc.message})
            raise

    def _delete(self, name: str, version: str, actor: str, deployed: Deployed, audit: Audit | None) -> ModelVersion:
        self.tmp.mkdir(parents=True, exist_ok=True)
        with self._sessions() as session:
            row = self._require(session, name, version)
            if deployed(name, version):
                raise Conflict(
                    f"model '{name}' version '{version}' is deployed; roll it out of service before deleting it"
                )
            session.delete(row)
            if audit is not None:
                audit(session, "model.delete", f"{name}/{version}", "ok", {"sha256": row.sha256})
            session.flush()
            with self._storage.removing(row):  # NOTE: files go with the commit, and stay if it fails
                session.commit()
        log.info("registry: %s deleted %s version %s (sha256 %s)", actor, name, version, row.sha256)
        return row

    # -- a plain folder store (an old HOME/models, the demo models) ---------------------------------------------------------

    def register_store(
        self, store_dir: Path, actor: str = "system:model-store", audit: Audit | None = None
    ) -> list[tuple[ModelVersion, bool]]:
        """Push every version in a plain store (<name>/<version>/ folders) not yet in the registry.

        Each is packed with its manifest as it stands and pushed like any archive (same checks, and
        `audit` records it); a version that fails validation is logged and skipped. Versions already
        registered are not packed again.
        """
        results = []
        self.tmp.mkdir(parents=True, exist_ok=True)
        for name in list_models(Path(store_dir)):
            for version in list_versions(Path(store_dir), name):
                with self._sessions() as session:
                    existing = self._find(session, name, version)
                if existing is not None:
                    results.append((existing, False))
                    continue
                source = Path(store_dir) / name / version
                work = Path(tempfile.mkdtemp(prefix="store-", dir=self.tmp))
                try:
                    archive = work / ARCHIVE_FILE
                    pack_archive(archive, read_store_manifest(source), _store_files(source))
                    results.append(self.push(archive, actor, audit=audit))
                except (ApiError, ValueError, OSError) as exc:
                    log.warning("registry: skipped %s version %s from %s: %s", name, version, source, exc)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
        return results


def _storage_for(settings: Settings, limits: ArchiveLimits) -> Storage:
    """Return the storage FLIGHTDECK_STORAGE_URL names: a bucket with a cache under HOME/cache, or the local disk."""
    url = parse_storage_url(settings.storage_url)
    if url is None:
        return LocalStorage(settings.home)
    # NOTE: imported here: boto3 is the optional `s3` extra, and a node on its local disk never needs it.
    from controlplane.registry.cache import VersionCache
    from controlplane.registry.s3storage import S3Storage

    cache = VersionCache(settings.home / "cache" / "models", limits)
    return S3Storage(url, cache, endpoint_url=settings.storage_endpoint_url or None)


def _store_files(source: Path) -> dict[str, Path]:
    files = {MODEL_FILE: source / MODEL_FILE}
    try:
        model = onnx.load(str(source / MODEL_FILE), load_external_data=False)
    except Exception:  # protobuf's DecodeError: the push that follows names the reason
        return files
    for _tensor, location in external_data_locations(model):
        files[location] = source / location
    files.pop(MANIFEST_FILE, None)
    return files


def _push_detail(row: ModelVersion, created: bool) -> dict[str, Any]:
    return {"sha256": row.sha256, "size_bytes": row.size_bytes, "created": created}


def _conflict(existing: ModelVersion, digest: str) -> Conflict:
    return Conflict(
        f"model '{existing.name}' version '{existing.version}' already exists with SHA-256 {existing.sha256}; "
        f"this archive's is {digest}. Versions are immutable: push it under a new version"
    )
