"""Rollout tests serve only the small model (accounts come from tests/controlplane/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def app_config(app_config: dict) -> dict:
    """The shared test settings (tests/conftest.py), serving only mlp and logging no request lines."""
    return app_config | {"log_sample_rate": 0.0, "load_models": "mlp"}
