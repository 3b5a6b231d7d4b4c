"""The on-disk model store: HOME/models/<name>/<version>/{model.onnx, manifest.json}."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import Settings
from serving.demo_models import write_demo_models


def prepare_home(settings: Settings) -> None:
    """Create the data directory and, on first start, the demo models."""
    for folder in (settings.home, settings.model_store, settings.log_dir):
        folder.mkdir(parents=True, exist_ok=True)
    if settings.demo_models:
        write_demo_models(settings.model_store)


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


def list_versions(store: Path, name: str) -> list[str]:
    """Return a model's versions in the store, oldest first (numeric order where numeric)."""
    folder = store / name
    if not folder.is_dir():
        return []
    found = [d.name for d in folder.iterdir() if (d / "model.onnx").is_file() and (d / "manifest.json").is_file()]
    return sorted(found, key=_version_key)


def list_models(store: Path) -> list[str]:
    """Return the names of models with at least one complete version."""
    if not store.is_dir():
        return []
    return sorted(d.name for d in store.iterdir() if d.is_dir() and list_versions(store, d.name))


def startup_versions(store: Path, only: str = "") -> dict[str, Path]:
    """Return the version directory to load into blue for each model at start: its first version."""
    wanted = [n.strip() for n in only.split(",") if n.strip()] or list_models(store)
    chosen = {}
    for name in wanted:
        versions = list_versions(store, name)
        if not versions:
            raise FileNotFoundError(f"model '{name}' has no complete version under {store / name}")
        chosen[name] = store / name / versions[0]
    return chosen


def version_folder(settings: Settings, sessions: sessionmaker[Session], name: str, version: str) -> Path:
    """Return a version's folder: from the registry, else the plain model store (the demo models)."""
    from controlplane.errors import NotFound
    from controlplane.registry.service import Registry

    registry = Registry.for_settings(sessions, settings)
    try:
        return registry.folder(registry.get(name, version))
    except NotFound:
        return settings.model_store / name / version
