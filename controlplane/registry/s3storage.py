"""Versions in an S3-compatible bucket every node shares, with each node's verified cache (FLIGHTDECK_STORAGE_URL).

Layout: s3://bucket/prefix/<name>/<version>/<archive sha256>/ holds archive.tar.gz and the files
it unpacked to (model.onnx, manifest.json, external data), so people and other tools can read a
version where it lies. Keys carry the archive's SHA-256: a version deleted and pushed again with
other bytes never shares a key with the old one, and two racing pushes of the same archive write
the same bytes to the same keys.

A node loads from its cache (`VersionCache`), filled from the archive, which is accepted only with
the SHA-256 the registry's row holds: the bucket is never trusted further than the database.

boto3 reads credentials and the region the usual way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, AWS_PROFILE, instance or pod roles);
FLIGHTDECK_STORAGE_ENDPOINT_URL (or AWS_ENDPOINT_URL) points it at MinIO, Ceph and other S3 APIs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.registry.archive import ARCHIVE_FILE
from controlplane.registry.cache import VersionCache
from controlplane.registry.errors import StorageUnavailable
from controlplane.registry.storage import Storage, StorageUrl

if TYPE_CHECKING:
    from controlplane.models import ModelVersion

log = logging.getLogger(__name__)

_MISSING = {"404", "NoSuchKey", "NotFound"}


def _boto3() -> tuple[Any, Any]:
    try:
        import boto3
        import botocore.config
    except ImportError:
        raise StorageUnavailable(
            "FLIGHTDECK_STORAGE_URL names an s3:// bucket but boto3 is not installed: pip install 'flightdeck[s3]'"
        ) from None
    return boto3, botocore.config


class S3Storage(Storage):
    """Versions' files in a bucket under a prefix; this node's copies in a SHA-256-keyed cache."""

    def __init__(self, url: StorageUrl, cache: VersionCache, endpoint_url: str | None = None) -> None:
        self._url = url
        self._cache = cache
        self._endpoint_url = endpoint_url
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def url(self) -> StorageUrl:
        return self._url

    @property
    def cache(self) -> VersionCache:
        return self._cache

    def client(self) -> Any:
        """Return the S3 client, made on first use (a CLI that only lists versions never needs one)."""
        with self._client_lock:
            if self._client is None:
                boto3, config = _boto3()
                # NOTE: a Session of our own: boto3's default one is not safe to create clients from in threads.
                self._client = boto3.session.Session().client(
                    "s3",
                    endpoint_url=self._endpoint_url,
                    config=config.Config(
                        # Path-style keys: what MinIO and other S3-compatible stores at an address expect.
                        s3={"addressing_style": "path"} if self._endpoint_url else {},
                        retries={"mode": "standard", "max_attempts": 5},
                        connect_timeout=10,
                        read_timeout=60,
                    ),
                )
            return self._client

    def prefix(self, row: ModelVersion) -> str:
        """Return the key prefix of a version's objects (no trailing slash)."""
        return self._url.key(row.name, row.version, row.sha256)

    def location(self, row: ModelVersion, name: str = "") -> str:
        """Return the s3:// address of a version's folder, or of one file in it."""
        return f"s3://{self._url.bucket}/{self.prefix(row)}/{name}"

    # -- push and delete -----------------------------------------------------------------

    def publish(self, row: ModelVersion, folder: Path) -> None:
        """Upload the archive and every file it unpacked to, then keep the folder as this node's cached copy."""
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        try:
            for path in files:
                key = f"{self.prefix(row)}/{path.relative_to(folder).as_posix()}"
                self.client().upload_file(str(path), self._url.bucket, key)
        except StorageUnavailable:
            raise
        except Exception as exc:  # botocore's ClientError, BotoCoreError, S3UploadFailedError
            raise StorageUnavailable(
                f"could not store {row.name} version {row.version} in {self.location(row)}: {exc}"
            ) from None
        log.info(
            "storage: uploaded %d file(s) of %s version %s to %s", len(files), row.name, row.version, self.location(row)
        )
        # NOTE: here, not in `place`: hashing a large model must not hold the row's lock, and an entry
        # keyed by content is valid whether or not the row commits (a stray one goes at the next start).
        self._cache.adopt(row.sha256, folder)

    def place(self, row: ModelVersion, folder: Path) -> Callable[[], None]:
        """Nothing more to do under the row's lock (the files are in the bucket and the cache); nothing to undo."""
        return lambda: None

    def withdraw(self, row: ModelVersion) -> None:
        """Delete every object under the version's prefix."""
        client = self.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self._url.bucket, Prefix=self.prefix(row) + "/")
        for page in pages:
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=self._url.bucket, Delete={"Objects": keys, "Quiet": True})

    @contextmanager
    def removing(self, row: ModelVersion) -> Iterator[None]:
        """After the delete commits, remove the version's objects and this node's copy (others' copies stay unused)."""
        yield
        # NOTE: after the commit: a failed commit must find its files; objects left by a failure here are only litter.
        try:
            self.withdraw(row)
        except Exception as exc:
            log.warning(
                "storage: could not delete %s (the version is gone; remove them by hand): %s", self.location(row), exc
            )
        self._cache.evict(row.sha256)

    # -- load ----------------------------------------------------------------------------

    def folder(self, row: ModelVersion) -> Path:
        """Return this node's verified copy of a version, fetching the archive when it is missing or damaged."""
        return self._cache.get(row.sha256, lambda dest: self._download(row, dest), f"{row.name} version {row.version}")

    def _download(self, row: ModelVersion, dest: Path) -> None:
        where = self.location(row, ARCHIVE_FILE)
        try:
            self.client().download_file(self._url.bucket, f"{self.prefix(row)}/{ARCHIVE_FILE}", str(dest))
        except StorageUnavailable:
            raise
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in _MISSING:
                raise StorageUnavailable(
                    f"{row.name} version {row.version}: {where} is missing from the object store; "
                    "push the version again (or restore the object)"
                ) from None
            raise StorageUnavailable(f"could not fetch {row.name} version {row.version} from {where}: {exc}") from None

    def prune(self, keep: set[str], wanted: set[str] | None = None) -> list[str]:
        """Drop this node's cached copies of versions no longer in the registry, or unused and deployed nowhere."""
        return self._cache.prune(keep, wanted)

    def describe(self) -> str:
        """Say where versions are kept, for logs."""
        endpoint = f" at {self._endpoint_url}" if self._endpoint_url else ""
        return f"{self._url}{endpoint} (cache {self._cache.root})"
