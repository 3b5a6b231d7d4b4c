"""A node's verified copies of versions kept in an object store: HOME/cache/models/<archive SHA-256>/.

An entry is filled from the version's archive, accepted only when its SHA-256 is the one the
registry's row recorded at push, and unpacked with the same checks a push gets; the SHA-256 and
size of every unpacked file go into `<sha256>.json` beside the folder (the pushing node writes it
from the folder it validated). Before every load each file is hashed again: a missing index, a
missing file or a changed one empties the entry and the archive is fetched again, so a damaged
copy is never handed to the engine. Entries are keyed by content, so a version deleted and pushed
again with other bytes never meets the old copy.

One fill at a time per entry across this node's processes: an flock on `<sha256>.lock`. An entry
that goes (its version deleted, or no longer named by any deployment and unused for a while:
`prune`) takes its lock file with it: removed while held, and whoever then gets the flock of the
removed file sees that it is no longer the one at the path and locks the new one instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.registry.archive import ARCHIVE_FILE, ArchiveLimits, extract_archive
from controlplane.registry.checks import MANIFEST_FILE, MODEL_FILE
from controlplane.registry.errors import StorageUnavailable
from controlplane.registry.storage import remove_tree
from serving.files import replace_file

log = logging.getLogger(__name__)

# Writes a version's archive to the path it is given (a download); raises StorageUnavailable.
Fetch = Callable[[Path], None]
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
UNUSED_S = 600.0  # a copy of a version no deployment names is kept this long after its last use (`prune`)


def file_sha256(path: Path) -> str:
    """Return a file's SHA-256 as hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_index(folder: Path) -> dict[str, dict[str, int | str]]:
    """Return every file under `folder` as relative path -> {sha256, size}."""
    files: dict[str, dict[str, int | str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        files[path.relative_to(folder).as_posix()] = {"sha256": file_sha256(path), "size": path.stat().st_size}
    return files


class VersionCache:
    """Verified local copies of versions, keyed by their archive's SHA-256."""

    def __init__(self, root: Path, limits: ArchiveLimits) -> None:
        self._root = Path(root)
        self._limits = limits

    @property
    def root(self) -> Path:
        return self._root

    def entry(self, digest: str) -> Path:
        """Return where the version with this archive SHA-256 is (or would be) unpacked."""
        if not _SHA256_RE.match(digest):  # it names a path: never anything but 64 hex digits
            raise ValueError(f"not a SHA-256 hex digest: {digest!r:.80}")
        return self._root / digest

    def get(self, digest: str, fetch: Fetch, what: str) -> Path:
        """Return the verified folder of the version whose archive has `digest`, fetching it when missing or damaged."""
        with self._locked(digest):
            problem = self.check(digest)
            if problem is None:
                os.utime(self._index_path(digest))  # its last use: `prune` keeps a copy in use
                return self.entry(digest)
            if problem == "not cached":
                log.info("cache: fetching %s (sha256 %s)", what, digest)
            else:
                log.warning("cache: %s: %s; fetching it again", what, problem)
            self._empty(digest)  # NOTE: before the fetch, so a failed fetch leaves nothing damaged behind
            self._fill(digest, fetch, what)
            return self.entry(digest)

    def adopt(self, digest: str, folder: Path) -> None:
        """Move a validated version's folder (a push on this node) in as the entry for `digest`."""
        with self._locked(digest):
            self._empty(digest)
            self._install(digest, folder)

    def evict(self, digest: str) -> None:
        """Remove the entry for `digest` and its lock file (its version was deleted, or is no longer wanted)."""
        with self._locked(digest):
            self._empty(digest)
            # NOTE: under the flock: a process waiting on this file finds it unlinked and locks the new one.
            self._lock_path(digest).unlink(missing_ok=True)

    def prune(
        self, keep: set[str], wanted: set[str] | None = None, unused_s: float = UNUSED_S, now: float | None = None
    ) -> list[str]:
        """Remove entries (and lock files) of versions not in `keep`, and of those not in `wanted` unused for `unused_s`.

        `keep`: every version still in the registry; `wanted`: those some deployment names (None: all
        of `keep`). A kept but unwanted copy goes only once nobody used it for `unused_s` seconds (a
        push, a fill or a load touches it), so a version deployed again a moment ago is never pulled
        from under its load. Return the digests removed.
        """
        if not self._root.is_dir():
            return []
        now = time.time() if now is None else now
        found = {p.name.split(".", 1)[0] for p in self._root.iterdir() if not p.name.startswith(".")}
        gone = []
        for digest in sorted(d for d in found if _SHA256_RE.match(d)):
            if digest in keep and (wanted is None or digest in wanted or not self._unused(digest, now - unused_s)):
                continue
            self.evict(digest)
            gone.append(digest)
        return gone

    def _unused(self, digest: str, before: float) -> bool:
        """Return whether the entry was last used (or, with no index, its lock last touched) before `before`."""
        for path in (self._index_path(digest), self._lock_path(digest)):
            try:
                return path.stat().st_mtime < before
            except FileNotFoundError:
                continue
        return True

    def check(self, digest: str) -> str | None:
        """Return what is wrong with the entry for `digest` ('not cached' when there is none), or None if it is whole."""
        index_path, folder = self._index_path(digest), self.entry(digest)
        if not index_path.exists():
            return "its file index is missing" if folder.exists() else "not cached"
        try:
            index = json.loads(index_path.read_text())
            files = {name: (int(meta["size"]), str(meta["sha256"])) for name, meta in index["files"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return "its file index is unreadable"
        if index.get("archive_sha256") != digest or not {MODEL_FILE, MANIFEST_FILE} <= set(files):
            return "its file index does not describe this version"
        if any(name.startswith("/") or ".." in name.split("/") for name in files):
            return "its file index names a file outside the copy"
        for name, (size, sha256) in sorted(files.items()):
            path = folder / name
            if not path.is_file():
                return f"{name} is missing from the cached copy"
            if path.stat().st_size != size or file_sha256(path) != sha256:
                return f"{name} in the cached copy does not match the SHA-256 recorded when it was cached"
        return None

    # -- filling -------------------------------------------------------------------------

    def _fill(self, digest: str, fetch: Fetch, what: str) -> None:
        work = Path(tempfile.mkdtemp(prefix=".fill-", dir=self._root))
        try:
            archive = work / ARCHIVE_FILE
            fetch(archive)
            actual = file_sha256(archive)
            if actual != digest:
                raise StorageUnavailable(
                    f"{what}: the stored archive's SHA-256 is {actual}, not {digest} as recorded at push; "
                    "it was not used (push the version again)"
                )
            folder = extract_archive(archive, work, self._limits)
            self._install(digest, folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _install(self, digest: str, folder: Path) -> None:
        """Index `folder`, move it into place, and write the index last: an entry with an index is whole."""
        (folder / ARCHIVE_FILE).unlink(missing_ok=True)  # the archive lives in the object store, not here
        index = {"archive_sha256": digest, "files": file_index(folder)}
        os.rename(folder, self.entry(digest))
        # NOTE: synced and renamed into place: a crash never leaves a partial index that says "whole".
        replace_file(self._index_path(digest), json.dumps(index, indent=1, sort_keys=True).encode())

    def _empty(self, digest: str) -> None:
        self._index_path(digest).unlink(missing_ok=True)
        folder = self.entry(digest)
        if folder.exists():
            remove_tree(folder, self._root)

    def _index_path(self, digest: str) -> Path:
        return self._root / f"{digest}.json"

    def _lock_path(self, digest: str) -> Path:
        return self.entry(digest).with_suffix(".lock")

    @contextmanager
    def _locked(self, digest: str) -> Iterator[None]:
        self._root.mkdir(parents=True, exist_ok=True)
        path = self._lock_path(digest)
        while True:
            lock = open(path, "a")  # noqa: SIM115 - held across the yield, closed below
            try:
                fcntl.flock(
                    lock, fcntl.LOCK_EX
                )  # NOTE: per open file, so threads of one process exclude each other too
                try:
                    same = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                # NOTE: `evict` unlinked the file while we waited on it: lock whatever is at the path now.
                lock.close()
            except BaseException:
                lock.close()
                raise
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
