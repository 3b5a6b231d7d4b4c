"""The key that signs session cookies: FLIGHTDECK_SECRET_KEY, or a random one generated into HOME once.

No default secret exists: with nothing configured, the first process to start writes 64 random
URL-safe characters to HOME/session-secret (mode 0600), and every later process (each gunicorn
worker, every node sharing HOME) reads the same file. The file appears atomically, complete or
not at all, so processes racing at the first start all end up with the one secret that won.
"""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
from pathlib import Path

from controlplane.config import MIN_SECRET_LENGTH, PREFIX, ConfigError, Settings

SECRET_FILE = "session-secret"


def secret_path(settings: Settings) -> Path:
    """Return where the generated secret is kept."""
    return settings.home / SECRET_FILE


def _create(path: Path) -> None:
    """Write a new random secret to `path` unless a file is already there; never a partial file."""
    text = (secrets.token_urlsafe(48) + "\n").encode()
    fd, scratch = tempfile.mkstemp(prefix=".session-secret-", dir=path.parent)  # mkstemp: mode 0600
    try:
        os.write(fd, text)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        # NOTE: link() fails when the name exists, so of several processes racing here exactly one wins,
        # and a reader never sees the file before its content is complete (as it could with O_EXCL + write).
        os.link(scratch, path)
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        _create_exclusive(path, text)  # a file system without hard links
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(scratch)


def _create_exclusive(path: Path, text: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)


def session_secret(settings: Settings) -> str:
    """Return the configured secret, or the one in HOME/session-secret, generating it on first use."""
    if configured := settings.secret_key.get_secret_value():
        return configured  # already checked when the settings were loaded
    path = secret_path(settings)
    settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        _create(path)
    secret = path.read_text().strip()
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"{path} holds no usable secret (fewer than {MIN_SECRET_LENGTH} characters); "
            f"delete it to have a new one generated, or set {PREFIX}SECRET_KEY"
        )
    return secret
