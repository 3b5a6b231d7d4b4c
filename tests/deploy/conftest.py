"""Rendered Kubernetes manifests, built once per test session and overlay."""

from __future__ import annotations

import pytest

from tests.deploy.kustomize import KUBERNETES, OVERLAYS, Obj, render


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Obj]]:
    """Every overlay of deploy/kubernetes, rendered by kustomize: {"base": [...], "overlays/gpu": [...], ...}."""
    return {overlay: render(KUBERNETES / overlay) for overlay in OVERLAYS}
