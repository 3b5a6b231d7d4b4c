"""A plain model store: `<name>/<version>/` folders, each with `model.onnx` and `manifest.json`.

What the registry imports from (`Registry.import_store`) and what an old `HOME/models` is; a leaf
module (paths only), so `modelstore` and `registry.service` both read it without importing each other.
"""

from __future__ import annotations

from pathlib import Path


def version_key(version: str) -> tuple[int, int | str]:
    """Sort key for versions: numeric ones in number order, before any other."""
    return (0, int(version)) if version.isdigit() else (1, version)


def list_versions(store: Path, name: str) -> list[str]:
    """Return a model's complete version folders in a plain store, oldest first (numeric order where numeric)."""
    folder = store / name
    if not folder.is_dir():
        return []
    found = [d.name for d in folder.iterdir() if (d / "model.onnx").is_file() and (d / "manifest.json").is_file()]
    return sorted(found, key=version_key)


def list_models(store: Path) -> list[str]:
    """Return the names of models with at least one complete version folder in a plain store."""
    if not store.is_dir():
        return []
    return sorted(d.name for d in store.iterdir() if d.is_dir() and list_versions(store, d.name))
