"""The key that signs session cookies: FLIGHTDECK_SECRET_KEY, or a random one generated into HOME once.

No default secret exists: with nothing configured, the first process to start writes 64 random
URL-safe characters to HOME/session-secret (mode 0600), and every later process (each gunicorn
worker, every node sharing HOME) reads the same file. The file appears atomically, complete or
not at all, so processes racing at the first start all end up with the one secret that won.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from controlplane.config import MIN_SECRET_LENGTH, PREFIX, ConfigError, Settings
from controlplane.privatefile import create_once

SECRET_FILE = "session-secret"


def secret_path(settings: Settings) -> Path:
    """Return where the generated secret is kept."""
    return settings.home / SECRET_FILE


def _create(path: Path) -> None:
    """Write a new random secret to `path` unless a file is already there; never a partial file."""
    create_once(path, (secrets.token_urlsafe(48) + "\n").encode())


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
