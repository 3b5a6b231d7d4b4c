"""Console tests: the real app (mlp only) with the product's access defaults, and logged-in test clients."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from controlplane.auth import Role
from controlplane.registry.archive import pack_archive
from serving.demo_models import build_model, demo_manifest
from tests.controlplane.conftest import log_in

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def app_config(app_config: dict) -> dict:
    """Serve only mlp, warmed at the shortest bucket; reads need a viewer, as in production."""
    config = app_config | {"load_models": "mlp", "warmup_max_sequence": 16, "log_sample_rate": 0.0}
    config.pop("auth_reads")
    return config


@pytest.fixture
def as_role(app):
    """Return open(role) -> (client, csrf): a new test client logged in as a new user with that role."""
    made = iter(range(1000))

    def open_as(role: Role):
        client = app.test_client()
        csrf = log_in(client, app, f"{role.value}{next(made)}", role)
        return client, csrf

    return open_as


def form_csrf(html: str) -> str:
    """Return the CSRF token a page's login or logout form carries."""
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def pack_model_archive(out: Path, name: str, version: str = "1", description: str = "") -> Path:
    """Pack the demo MLP at `version` as a new model `name`, with the project's own builders."""
    model = build_model("mlp", version)
    folder = out.parent / f"{name}-{version}-src"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    manifest = demo_manifest("mlp", version, model) | {"name": name}
    if description:
        manifest["metadata"] = manifest["metadata"] | {"description": description}
    pack_archive(out, manifest, {"model.onnx": folder / "model.onnx"})
    return out


def push_archive(client, csrf: str, archive: Path):
    """Push an archive through the registry API as the console's script does (multipart, CSRF header)."""
    with archive.open("rb") as f:
        return client.post(
            "/api/models",
            data={"archive": (f, archive.name)},
            headers={"X-CSRF-Token": csrf},
            content_type="multipart/form-data",
        )
