"""Files replaced whole: a reader (another process included) sees the old file or the new one, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, content: bytes) -> None:
    """Replace `path` atomically with `content` (mode 0600): a scratch file in its folder, synced, then renamed."""
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)  # NOTE: no scratch file (perhaps a copy of a secret) left behind
        raise
