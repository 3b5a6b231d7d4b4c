"""Files only this OS user may read, written so that no process ever sees one half-written.

Replacing one whole: serving.files.replace_file (mode 0600 too).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def create_once(path: Path, content: bytes) -> None:
    """Write `content` to `path` (mode 0600) unless a file is there; of processes racing here exactly one wins.

    The content goes to a scratch file first (mkstemp: mode 0600), then link() gives it its name:
    link fails when the name exists, and a reader never sees the file before it is complete (as it
    could with O_EXCL + write). A file system without hard links falls back to O_EXCL.
    """
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        os.write(fd, content)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.link(scratch, path)
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        _create_exclusive(path, content)
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(scratch)


def _create_exclusive(path: Path, content: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
