"""Alerting tests serve only the small model (accounts come from tests/controlplane/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def app_config(home) -> dict:
    return {"home": str(home), "scheduler": False, "log_sample_rate": 0.0, "load_models": "mlp"}
