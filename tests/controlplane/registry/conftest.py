"""Real archives over real ONNX models: tiny ones built with onnx.helper, and the demo MLP."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import select

from controlplane.db import make_engine, session_factory
from controlplane.models import ModelVersion
from controlplane.registry.archive import ArchiveLimits
from controlplane.registry.service import Registry
from serving.golden import encode_tensor

LIMITS = ArchiveLimits(max_archive_bytes=4 * 1024 * 1024, max_files=8, max_unpacked_bytes=2 * 1024 * 1024)
WEIGHTS = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)


def add_model(weights_external: str | None = None, opset: int = 17) -> onnx.ModelProto:
    """y = x + w over [batch, 4] FP32; `weights_external` stores w as external data at that location."""
    w = numpy_helper.from_array(WEIGHTS, "w")
    if weights_external is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        entry = w.external_data.add()
        entry.key, entry.value = "location", weights_external
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def add_manifest(name: str = "adder", version: str = "1", **changes: Any) -> dict[str, Any]:
    """The manifest of add_model, with one golden sample computed by numpy."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    manifest = {
        "name": name,
        "version": version,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
        "batching": {"max_batch_size": 8},
        "golden": [{"inputs": {"x": encode_tensor(x)}, "outputs": {"y": encode_tensor(x + WEIGHTS)}}],
        "metadata": {"description": "adds four weights"},
    }
    manifest.update(changes)
    return manifest


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tuple:
    return (name, data, kind, linkname, mode)


def make_tar(members: list[tuple], gzipped: bool = True) -> bytes:
    """Build a tar(.gz) in memory from member() tuples, exactly as given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, kind, linkname, mode in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, linkname, mode
            info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0) if gzipped else raw


def good_members(model: onnx.ModelProto | None = None, manifest: dict | None = None) -> list[tuple]:
    return [
        member("model.onnx", (model or add_model()).SerializeToString()),
        member("manifest.json", json.dumps(manifest or add_manifest()).encode()),
    ]


@pytest.fixture
def home(tmp_path: Path, migrated_db: Path) -> Path:
    """An empty data directory (a migrated database, an empty registry): these tests count what they store."""
    path = tmp_path / "home"
    path.mkdir()
    shutil.copyfile(migrated_db, path / "flightdeck.db")
    return path


@pytest.fixture
def sessions(home: Path) -> Iterator:
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def registry(sessions, home: Path) -> Registry:
    return Registry(sessions, home, LIMITS)


def assert_nothing_kept(home: Path, sessions) -> None:
    """No row, no file under HOME/registry, nothing left in HOME/tmp."""
    with sessions() as session:
        assert session.scalars(select(ModelVersion)).all() == []
    registry_dir = home / "registry"
    assert not registry_dir.exists() or [p for p in registry_dir.rglob("*") if not p.is_dir()] == []
    assert not (home / "tmp").exists() or list((home / "tmp").iterdir()) == []
