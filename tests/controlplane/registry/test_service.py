"""Pushing, re-pushing, tagging, listing, deleting, and importing the model store, over the demo MLP."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from controlplane.errors import ApiError
from controlplane.models import ModelVersion
from controlplane.registry.archive import build_archive, pack_archive
from controlplane.registry.service import Registry
from serving.engine import Engine, read_manifest
from serving.golden import check_golden
from serving.settings import BatchingSettings, RuntimeSettings
from tests.controlplane.registry.conftest import add_model, assert_nothing_kept, good_members, make_tar


def demo_archive(demo_store: Path, out: Path, version: str = "1", **changes) -> Path:
    """Pack the demo MLP at `version` as the model store holds it, with manifest changes."""
    source = demo_store / "mlp" / version
    pack_archive(out, {**read_manifest(source), **changes}, {"model.onnx": source / "model.onnx"})
    return out


def test_push_stores_files_and_row_and_the_hash_is_the_identity(
    registry: Registry, demo_store: Path, tmp_path: Path, home: Path
) -> None:
    archive = demo_archive(demo_store, tmp_path / "mlp-1.tar.gz")
    row, created = registry.push(archive, "alice")
    assert created
    assert (row.name, row.version, row.pushed_by, row.golden_passed) == ("mlp", "1", "alice", True)
    assert row.sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert row.size_bytes == archive.stat().st_size and row.path == "registry/mlp/1"
    folder = home / "registry" / "mlp" / "1"
    assert sorted(p.name for p in folder.iterdir()) == ["archive.tar.gz", "manifest.json", "model.onnx"]
    assert (folder / "archive.tar.gz").read_bytes() == archive.read_bytes()
    assert (folder / "model.onnx").read_bytes() == (demo_store / "mlp" / "1" / "model.onnx").read_bytes()
    assert row.manifest == read_manifest(folder)
    assert list((home / "tmp").iterdir()) == []


def test_a_pushed_version_loads_into_the_engine_and_its_golden_samples_pass_there(
    registry: Registry, demo_store: Path, tmp_path: Path
) -> None:
    row, _ = registry.push(demo_archive(demo_store, tmp_path / "a.tar.gz"), "alice")
    engine = Engine(RuntimeSettings(device="cpu"), BatchingSettings(instances=1))
    try:
        loaded = engine.load(registry.folder(row), "blue")
        assert loaded.spec.version == "1"
        assert check_golden(read_manifest(loaded.path), loaded.session.run) == []
        out = engine.infer("mlp", {"input": np.zeros((2, 64), dtype=np.float32)})
        assert out.outputs["probabilities"].shape == (2, 10)
    finally:
        engine.drain(5)


def test_pushing_the_same_archive_again_is_idempotent(
    registry: Registry, demo_store: Path, tmp_path: Path, sessions, home: Path
) -> None:
    archive = demo_archive(demo_store, tmp_path / "a.tar.gz")
    first, created = registry.push(archive, "alice")
    with open(archive, "rb") as f:
        again, created_again = registry.push(f, "bob", expected_sha256=first.sha256.upper())
    assert created and not created_again
    assert again.id == first.id and again.pushed_by == "alice"
    with sessions() as session:
        assert len(session.scalars(select(ModelVersion)).all()) == 1
    assert list((home / "tmp").iterdir()) == []


def test_a_different_archive_under_an_existing_version_is_409_naming_both_hashes(
    registry: Registry, demo_store: Path, tmp_path: Path, home: Path
) -> None:
    first, _ = registry.push(demo_archive(demo_store, tmp_path / "a.tar.gz"), "alice")
    other = demo_archive(demo_store, tmp_path / "b.tar.gz", description="retrained")
    other_sha = hashlib.sha256(other.read_bytes()).hexdigest()
    with pytest.raises(ApiError) as refused:
        registry.push(other, "bob")
    assert refused.value.status == 409
    assert first.sha256 in refused.value.message and other_sha in refused.value.message
    assert registry.get("mlp", "1").sha256 == first.sha256
    assert (registry.folder(first) / "archive.tar.gz").read_bytes() == (tmp_path / "a.tar.gz").read_bytes()
    assert list((home / "tmp").iterdir()) == []


def test_tag_list_show_and_resolve(registry: Registry, demo_store: Path, tmp_path: Path) -> None:
    v1, _ = registry.push(demo_archive(demo_store, tmp_path / "1.tar.gz", "1"), "alice")
    v2, _ = registry.push(demo_archive(demo_store, tmp_path / "2.tar.gz", "2"), "alice")
    registry.push(io.BytesIO(make_tar(good_members())), "alice")
    assert registry.tag("mlp", "1", ["stable", "prod", "stable"], "alice").tags == ["prod", "stable"]
    assert registry.tag("mlp", "2", ["stable"], "alice").tags == ["stable"]
    assert registry.get("mlp", "1").tags == ["prod"]  # a tag names one version per model
    assert registry.resolve("mlp", "stable").version == "2"
    assert registry.resolve("mlp", "1").version == "1"
    assert [(r.name, r.version) for r in registry.list()] == [("adder", "1"), ("mlp", "1"), ("mlp", "2")]
    assert [r.version for r in registry.list("mlp")] == ["1", "2"]
    assert registry.get("mlp", "2").manifest["name"] == "mlp"
    for call in (lambda: registry.get("mlp", "9"), lambda: registry.resolve("mlp", "canary")):
        with pytest.raises(ApiError) as missing:
            call()
        assert missing.value.status == 404
    with pytest.raises(ApiError) as bad:
        registry.tag("mlp", "1", ["no spaces"], "alice")
    assert bad.value.status == 400 and "must match" in bad.value.message


def test_delete_is_refused_while_deployed_and_removes_everything_otherwise(
    registry: Registry, demo_store: Path, tmp_path: Path, home: Path, sessions
) -> None:
    row, _ = registry.push(demo_archive(demo_store, tmp_path / "a.tar.gz"), "alice")
    asked = []

    def deployed(name: str, version: str) -> bool:
        asked.append((name, version))
        return True

    with pytest.raises(ApiError) as refused:
        registry.delete("mlp", "1", "alice", deployed=deployed)
    assert refused.value.status == 409 and "is deployed" in refused.value.message
    assert asked == [("mlp", "1")] and (registry.folder(row) / "model.onnx").exists()
    registry.delete("mlp", "1", "alice", deployed=lambda name, version: False)
    assert_nothing_kept(home, sessions)
    with pytest.raises(ApiError) as missing:
        registry.delete("mlp", "1", "alice")
    assert missing.value.status == 404
    again, created = registry.push(tmp_path / "a.tar.gz", "alice")  # the version can come back
    assert created and (registry.folder(again) / "model.onnx").exists()


def test_audit_events_go_with_the_change_and_with_refusals(registry: Registry, tmp_path: Path, sessions) -> None:
    events = []

    def audit(session, action, target, outcome, detail):
        events.append((action, target, outcome, sorted(detail)))

    registry.push(io.BytesIO(make_tar(good_members())), "alice", audit=audit)
    registry.push(io.BytesIO(make_tar(good_members())), "alice", audit=audit)
    with pytest.raises(ApiError):
        registry.push(io.BytesIO(b"junk"), "alice", audit=audit)
    registry.tag("adder", "1", ["stable"], "alice", audit=audit)
    registry.delete("adder", "1", "alice", audit=audit)
    assert events == [
        ("model.push", "adder/1", "ok", ["created", "sha256", "size_bytes"]),
        ("model.push", "adder/1", "ok", ["created", "sha256", "size_bytes"]),
        ("model.push", "", "error", ["error", "sha256", "size_bytes"]),
        ("model.tag", "adder/1", "ok", ["tags"]),
        ("model.delete", "adder/1", "ok", ["sha256"]),
    ]


def test_build_archive_is_deterministic(tmp_path: Path) -> None:
    onnx_path = tmp_path / "add.onnx"
    onnx_path.write_bytes(add_model().SerializeToString())
    shas = [
        build_archive(onnx_path, tmp_path / f"{i}.tar.gz", name="adder", version="1", max_batch_size=8)
        for i in range(2)
    ]
    assert shas[0] == shas[1] == hashlib.sha256((tmp_path / "0.tar.gz").read_bytes()).hexdigest()
    assert (tmp_path / "0.tar.gz").read_bytes() == (tmp_path / "1.tar.gz").read_bytes()
    os.utime(onnx_path, (0, 1_000_000))  # file times do not enter the archive
    assert build_archive(onnx_path, tmp_path / "2.tar.gz", name="adder", version="1", max_batch_size=8) == shas[0]
    assert build_archive(onnx_path, tmp_path / "3.tar.gz", name="adder", version="2", max_batch_size=8) != shas[0]


def test_build_archive_derives_the_manifest_from_the_graph(registry: Registry, tmp_path: Path) -> None:
    onnx_path = tmp_path / "add.onnx"
    onnx_path.write_bytes(add_model().SerializeToString())
    build_archive(onnx_path, tmp_path / "a.tar.gz", name="adder", version="3", max_batch_size=4, description="x+w")
    row, _ = registry.push(tmp_path / "a.tar.gz", "alice")
    assert row.manifest["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert row.manifest["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    assert row.manifest["batching"] == {"max_batch_size": 4}
    assert row.description == "x+w" and row.golden_passed is None


def test_register_store_imports_each_version_once(
    registry: Registry, demo_store: Path, tmp_path: Path, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    for version in ("1", "2"):
        (store / "mlp" / version).mkdir(parents=True)
        for item in ("model.onnx", "manifest.json"):
            os.symlink(demo_store / "mlp" / version / item, store / "mlp" / version / item)
    (store / "broken" / "1").mkdir(parents=True)
    (store / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    (store / "broken" / "1" / "manifest.json").write_text(json.dumps({"name": "broken", "version": "1"}))
    first = registry.register_store(store)
    assert [(r.name, r.version, created) for r, created in first] == [("mlp", "1", True), ("mlp", "2", True)]
    assert all(r.golden_passed for r, _ in first)
    assert "skipped broken version 1" in caplog.text and "manifest.json: field 'inputs': is required" in caplog.text
    again = registry.register_store(store)
    assert [(r.id, created) for r, created in again] == [(r.id, False) for r, _ in first]
    assert not any(p.is_symlink() for p in (home / "registry").rglob("*"))
    assert list((home / "tmp").iterdir()) == []
