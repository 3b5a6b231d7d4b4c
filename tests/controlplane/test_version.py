"""The version is written once, in controlplane.__version__; the package and the server report it."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import controlplane

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "controlplane.__version__"}


def test_server_metadata_and_package_metadata_agree(client) -> None:
    response = client.get("/v2")
    assert response.status_code == 200
    assert response.get_json()["version"] == controlplane.__version__ == importlib.metadata.version("flightdeck")
