"""The registry's errors; each carries its HTTP status and names the reason in its message."""

from __future__ import annotations

from controlplane.errors import ApiError


class RegistryError(ApiError):
    """A registry operation was refused."""

    status = 400
    code = "registry_error"


class InvalidArchive(RegistryError):
    """A pushed archive failed validation; nothing from it was kept."""

    code = "invalid_archive"


class ArchiveTooLarge(InvalidArchive):
    """The archive itself is over FLIGHTDECK_MAX_ARCHIVE_BYTES."""

    status = 413
    code = "archive_too_large"


class HashMismatch(InvalidArchive):
    """The archive's SHA-256 is not the one the pusher said it would be."""

    code = "sha256_mismatch"


class StorageUnavailable(RegistryError):
    """The object store holding versions' files failed, or lacks or altered a version's archive."""

    status = 502
    code = "storage_unavailable"
