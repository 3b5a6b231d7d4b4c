"""What a version's load measured, shared by the workers of a node: one cost curve, one lone-request decision.

Every worker loads every version itself, and used to time it itself: its cost curve (serving.batchcost)
and its lone-request session (serving.engine). On a flat curve those timings chose different limits in
the two workers of one server (textcls seq 16: 1, 4 or 32; seq 32: 2 or 8), so `/v2/models/{m}/config`
answered differently by the worker that served it and the two workers batched differently; in a soak,
one worker kept a lone-request session and the other did not. Now the first worker to measure a version
writes what it measured into a folder of the node (`FLIGHTDECK_HOME/measured/`), and the others read it.
The workers of a node load one version at a time: each holds the node's load lock (`.loading.lock`,
flock(2), released even by a worker killed mid-load) while it builds the session, warms it up and
measures or reads its record. So a second worker waits for the first one's record instead of timing
beside it (the node's claim on its cores, serving.cores, gives up waiting after 2 s, and a cost curve
may take 3), and no worker's session building or warm-up, which take no claim, runs on a core beside
another's timings: at one start that made textcls's lone session look no faster (5.74 ms against
5.70 on one thread, where it takes 3.0-3.4), and with the decision shared, the whole node lost it.

A record is keyed by the model file (its path, size, modification time and inode), its manifest and
every setting that shapes the timings. The control plane wipes the folder when the server starts:
each start measures afresh, on the machine as it is then. A record that cannot be read is measured again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serving.files import replace_file

log = logging.getLogger(__name__)

LOAD_LOCK = ".loading.lock"


class Measurements:
    """Records of what loads measured, one JSON file per key in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @staticmethod
    def key(version_dir: Path, context: dict[str, Any]) -> str:
        """The key of one version's measurements under the settings in `context` (JSON-able values)."""
        model = (version_dir / "model.onnx").stat()
        identity = {
            "model": [str(version_dir.resolve()), model.st_size, model.st_mtime_ns, model.st_ino],
            "manifest": hashlib.sha256((version_dir / "manifest.json").read_bytes()).hexdigest(),
            "context": context,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Hold the node's load lock while this worker builds, warms up and measures a version."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / LOAD_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # NOTE: then workers load (and may measure) side by side, as they did before
            log.warning("could not take the node's load lock in %s: %s", self.folder, exc)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def get(self, key: str) -> dict[str, Any]:
        """Return the record of `key` ({} where none was written, or it cannot be read)."""
        path = self.folder / f"{key}.json"
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignored the measurements in %s: %s", path, exc)
            return {}
        return record if isinstance(record, dict) else {}

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Write the record of `key` whole (serving.files: a reader sees the old record or the new one)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            replace_file(self.folder / f"{key}.json", json.dumps(record).encode())
        except OSError as exc:  # NOTE: sharing is an economy: this worker's own figures serve it either way
            log.warning("could not share the measurements of %s: %s", key, exc)
