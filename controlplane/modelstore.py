"""The data directory's models: the registry is the one store served versions come from.

Its files are under HOME/registry, or in an S3-compatible bucket shared by every node
(FLIGHTDECK_STORAGE_URL), each node loading from its own verified cache under HOME/cache.

At start the home is prepared once (by the gunicorn master's `prepare` child, or by `build_services`):
an old home's `HOME/models/<name>/<version>/` folders are pushed into the registry and the folder is
moved aside, and on a first start the demo models are pushed like any other archive, by the system
actor, and deployed. Which models are served is then the `deployments` table, nothing on disk.
"""

from __future__ import annotations

import logging
import shutil
import stat
import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import Settings
from controlplane.registry.plainstore import list_models, list_versions

log = logging.getLogger(__name__)

LEGACY_STORE = "models"  # HOME/models: the store before the registry; read once, then moved aside
# Files under HOME that must stay private: password hashes, the signing secret, the first admin's password.
PRIVATE_FILES = (
    "flightdeck.db", "flightdeck.db-wal", "flightdeck.db-shm", "session-secret", "secret.key", "initial-admin-password",
)  # fmt: skip
Stored = set[tuple[str, str]]  # (name, version) pairs the registry holds after a push


def prepare_home(settings: Settings) -> None:
    """Create the data directory (0700) and its log and scratch folders, the session secret; warn of loose modes."""
    from controlplane.alerting.secretbox import Keyring
    from controlplane.auth.session_secret import session_secret

    for folder in (settings.home, settings.log_dir, settings.home / "tmp"):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    session_secret(settings)  # NOTE: generated here, before any worker starts, when none is configured
    Keyring.for_settings(settings).ensure()  # the receiver secrets' key, likewise
    for loose in loosened_paths(settings.home):
        log.warning(
            "%s is open to other OS users (mode %o); chmod go-rwx it", loose, stat.S_IMODE(loose.stat().st_mode)
        )


def loosened_paths(home: Path) -> list[Path]:
    """Return HOME and the private files in it that other OS users may read (or enter)."""
    candidates = [home, *(home / name for name in PRIVATE_FILES)]
    return [path for path in candidates if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077]


def _first_versions(store: Path) -> dict[str, str]:
    return {name: list_versions(store, name)[0] for name in list_models(store)}


def _move_aside(folder: Path) -> Path:
    """Rename `folder` to the first free `<name>.migrated[-N]` beside it, so it is never read again."""
    target = folder.with_name(f"{folder.name}.migrated")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}.migrated-{n}")
    folder.rename(target)
    return target


def _nothing_stored(sessions: sessionmaker[Session]) -> bool:
    """Return whether the registry is empty and nothing is deployed: a first start."""
    from controlplane.models import Deployment, ModelVersion

    with sessions() as session:
        version = session.scalars(select(ModelVersion.id).limit(1)).first()
        deployment = session.scalars(select(Deployment.model).limit(1)).first()
    return version is None and deployment is None


def _push_store(settings: Settings, sessions: sessionmaker[Session], store: Path) -> tuple[dict[str, str], Stored]:
    """Push a plain store's versions as the system; return each model's first version and the (name, version) stored."""
    from controlplane.registry.service import Registry
    from controlplane.rollout.audit import system_audit

    first = _first_versions(store)
    pushed = Registry.for_settings(sessions, settings).register_store(store, audit=system_audit)
    return first, {(row.name, row.version) for row, _ in pushed}


def _deploy_first(sessions: sessionmaker[Session], first: dict[str, str], stored: Stored) -> list[str]:
    """Create a deployment (first version in blue, all traffic) for each stored model that has none; audited."""
    from controlplane.rollout.audit import system_audit
    from controlplane.rollout.deployments import ensure_deployments

    versions = {name: v for name, v in first.items() if (name, v) in stored}
    with sessions() as session, session.begin():
        return ensure_deployments(session, versions, audit=system_audit)


def migrate_legacy_store(settings: Settings, sessions: sessionmaker[Session]) -> list[str]:
    """Push every complete version under HOME/models into the registry once, then move the folder aside.

    A home that was never started (no deployments yet) then serves each migrated model's first
    version, as it would have before; otherwise the deployments table already says what is served.
    A version that fails the registry's checks is logged and left in the moved folder. Return the
    models migrated.
    """
    store = settings.home / LEGACY_STORE
    if not store.is_dir():
        return []
    fresh = _nothing_stored(sessions)
    first, stored = _push_store(settings, sessions, store)
    moved = _move_aside(store)
    log.info("migrated %d version(s) from %s into the registry; the folder is now %s", len(stored), store, moved)
    if fresh:
        _deploy_first(sessions, first, stored)
    return sorted({name for name, _ in stored})


def seed_demo_models(settings: Settings, sessions: sessionmaker[Session], built: Path | None = None) -> list[str]:
    """On a first start (nothing in the registry, nothing deployed), push the demo models and deploy each one's v1.

    `built`: a folder where the demo models were already written (the tests build them once);
    by default they are written to a scratch folder under HOME/tmp and removed after the push.
    """
    from serving.demo_models import write_demo_models

    if not settings.demo_models or not _nothing_stored(sessions):
        return []
    if built is not None:
        first, stored = _push_store(settings, sessions, built)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="demo-", dir=settings.home / "tmp"))
        try:
            write_demo_models(scratch)
            first, stored = _push_store(settings, sessions, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return _deploy_first(sessions, first, stored)


def prepare_store(settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Bring the registry up to date at start: an old HOME/models, the demo models on a first start, stale copies."""
    from controlplane.alerting.secretbox import Keyring, seal_plaintext
    from controlplane.registry.service import Registry

    prepare_home(settings)
    sealed = seal_plaintext(sessions, Keyring.for_settings(settings))  # receivers saved before encryption existed
    if sealed:
        log.info("encrypted the secrets of %d receiver(s) stored in plaintext", sealed)
    migrate_legacy_store(settings, sessions)
    seed_demo_models(settings, sessions)
    Registry.for_settings(sessions, settings).prune_copies()
