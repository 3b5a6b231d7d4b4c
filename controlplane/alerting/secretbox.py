"""Receiver secrets encrypted at rest: Fernet keys kept outside the database, rotation without downtime.

A receiver's configuration (its URL with the key in it, signing secret, bearer token, password:
every notifier puts a secret somewhere in it) is stored as one Fernet token, `{"sealed": "gAAAA..."}`,
so the `receivers` table holds no secret a reader of the database file could use. The keys are
`FLIGHTDECK_SECRET_KEYS` (comma-separated, newest first: deployments that inject secrets), else
`HOME/secret.key` (one key a line, newest first, mode 0600, generated at the first start). The
newest key encrypts; every listed key decrypts (cryptography's MultiFernet), so a rotation adds a
key first, re-encrypts every row, then drops the old key.

Rows written before encryption existed are plaintext dicts: read as they are, and sealed at start
(`seal_plaintext`, run by the `prepare` step) and by every rotation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import PREFIX, Settings, parse_fernet_keys
from controlplane.models import Receiver
from controlplane.privatefile import create_once
from serving.files import replace_file

KEY_FILE = "secret.key"
SEALED = "sealed"  # the one field of a stored, encrypted receiver configuration


class SecretKeyError(ValueError):
    """The keys are missing, malformed, or none of them opens a stored configuration."""


def _write_private(path: Path, keys: list[bytes]) -> None:
    """Replace `path` with these keys atomically: a reader sees the old file or the new one, never a part."""
    replace_file(path, b"".join(k + b"\n" for k in keys))


def _create(path: Path) -> None:
    """Write a first key to `path` unless one is there; of processes racing here exactly one wins."""
    create_once(path, Fernet.generate_key() + b"\n")


@dataclass
class Keyring:
    """The keys of receiver secrets: configured ones, or HOME/secret.key re-read whenever it changes.

    Example:
        keys = Keyring.for_settings(settings)
        row.config = keys.seal({"url": "https://hooks.slack.com/services/T/B/x"})
        keys.open(row.config)["url"]
    """

    path: Path | None
    configured: str = field(default="", repr=False)  # FLIGHTDECK_SECRET_KEYS: never in a repr or a log
    _loaded: tuple[tuple[int, int], MultiFernet] | None = field(default=None, repr=False)

    @classmethod
    def for_settings(cls, settings: Settings) -> Keyring:
        """Return the keyring these settings name (FLIGHTDECK_SECRET_KEYS, else HOME/secret.key)."""
        return cls(settings.home / KEY_FILE, settings.secret_keys.get_secret_value())

    def ensure(self) -> None:
        """Generate HOME/secret.key (0600) when no key is configured and none exists yet."""
        if not self.configured and self.path is not None and not self.path.exists():
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _create(self.path)

    def keys(self) -> list[bytes]:
        """Return the keys, newest first."""
        if self.configured:
            return parse_fernet_keys(self.configured)
        if self.path is None or not self.path.exists():
            raise SecretKeyError(
                f"no key for receiver secrets: {self.path} is missing and {PREFIX}SECRET_KEYS is unset"
            )
        try:
            keys = parse_fernet_keys(self.path.read_text())
        except ValueError as exc:
            raise SecretKeyError(f"{self.path}: {exc}") from None
        if not keys:
            raise SecretKeyError(f"{self.path} holds no key")
        return keys

    def fernet(self) -> MultiFernet:
        """Return the MultiFernet of the current keys (the file is read again only when it changed)."""
        stamp = (0, 0)
        if not self.configured and self.path is not None and self.path.exists():
            info = self.path.stat()
            stamp = (info.st_mtime_ns, info.st_ino)  # NOTE: os.replace gives a rotated file a new inode
        if self._loaded is None or self._loaded[0] != stamp:
            self._loaded = (stamp, MultiFernet([Fernet(k) for k in self.keys()]))
        return self._loaded[1]

    def seal(self, config: dict[str, Any]) -> dict[str, str]:
        """Return `config` encrypted with the newest key, as it is stored."""
        return {SEALED: self.fernet().encrypt(json.dumps(config, sort_keys=True).encode()).decode()}

    def open(self, stored: dict[str, Any]) -> dict[str, Any]:
        """Return the plain configuration of a stored one (a plaintext row, from before encryption, as it is)."""
        return open_config(stored, self)


def is_sealed(stored: object) -> bool:
    """Return whether a stored configuration is encrypted."""
    return isinstance(stored, dict) and set(stored) == {SEALED} and isinstance(stored[SEALED], str)


def open_config(stored: dict[str, Any], keys: Keyring | None) -> dict[str, Any]:
    """Return the plain configuration of a stored one; ValueError when it is sealed and no key opens it."""
    if not is_sealed(stored):
        return stored
    if keys is None:
        raise SecretKeyError("the receiver's secrets are encrypted and no key was given")
    try:
        return json.loads(keys.fernet().decrypt(stored[SEALED].encode()))
    except InvalidToken:
        raise SecretKeyError(
            f"the receiver's secrets cannot be decrypted with the configured keys ({PREFIX}SECRET_KEYS or "
            f"HOME/{KEY_FILE}): was the key replaced instead of rotated?"
        ) from None


def _rewrite(sessions: sessionmaker[Session], change: Callable[[Receiver], bool]) -> int:
    """Apply `change` to every receiver row in one transaction; return how many it changed.

    NOTE: on SQLite the replaced plaintext would otherwise linger in the pages' free space and in
    the write-ahead log: secure_delete zeroes it, and a truncating checkpoint empties the log.
    """
    with sessions() as db:
        sqlite = db.get_bind().dialect.name == "sqlite"
        if sqlite:
            db.execute(text("PRAGMA secure_delete = ON"))
        changed = sum(change(row) for row in db.scalars(select(Receiver)))
        db.commit()
        if sqlite and changed:
            db.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    return changed


def seal_plaintext(sessions: sessionmaker[Session], keys: Keyring) -> int:
    """Encrypt every receiver still stored in plaintext; return how many were."""

    def seal(row: Receiver) -> bool:
        if is_sealed(row.config):
            return False
        row.config = keys.seal(row.config)
        return True

    return _rewrite(sessions, seal)


def reencrypt_all(sessions: sessionmaker[Session], keys: Keyring) -> int:
    """Re-encrypt every receiver with the newest key (sealing plaintext ones too); return how many rows."""
    fernet = keys.fernet()

    def rotate(row: Receiver) -> bool:
        if is_sealed(row.config):
            try:
                row.config = {SEALED: fernet.rotate(row.config[SEALED].encode()).decode()}
            except InvalidToken:
                raise SecretKeyError(f"receiver {row.name!r}: none of the configured keys opens its secrets") from None
        else:
            row.config = keys.seal(row.config)
        return True

    return _rewrite(sessions, rotate)


def rotate_key(sessions: sessionmaker[Session], keys: Keyring) -> tuple[int, bool]:
    """Rotate to a new key: add it first, re-encrypt every row, then drop the old ones; return (rows, new key made).

    With FLIGHTDECK_SECRET_KEYS the operator adds the new key in front; this then re-encrypts every
    row with it and the old keys may be removed from the variable. With HOME/secret.key a new key is
    generated; until every row is re-encrypted the file keeps the old keys too, so every process can
    still read every row, and a rotation that stops half-way leaves nothing unreadable.
    """
    if keys.configured:
        return reencrypt_all(sessions, keys), False
    assert keys.path is not None
    keys.ensure()
    old = keys.keys()
    new = Fernet.generate_key()
    _write_private(keys.path, [new, *old])
    count = reencrypt_all(sessions, keys)
    _write_private(keys.path, [new])
    return count, True
