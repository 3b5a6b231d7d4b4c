"""Shared model storage: two nodes (homes) over one database and one bucket of a real S3 API.

The S3 API is moto's server on a free 127.0.0.1 port (ThreadedMotoServer): boto3 talks HTTP to it
as it would to AWS or MinIO. Each test gets a bucket of its own.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from flask import Flask
from moto.server import ThreadedMotoServer
from sqlalchemy import select

from controlplane.auth import Role
from controlplane.config import ConfigError, load_settings
from controlplane.db import make_engine, session_factory
from controlplane.migrate import upgrade
from controlplane.models import SlotStatus
from controlplane.registry.errors import StorageUnavailable
from controlplane.registry.service import Registry
from controlplane.registry.storage import LocalStorage, StorageUrl, parse_storage_url
from tests.controlplane.registry.conftest import WEIGHTS, add_manifest, add_model, good_members, make_tar
from tests.controlplane.registry.test_api import token_for

PREFIX = "fleet"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API on 127.0.0.1 (moto's server mode), stopped after this module's tests."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; credentials and region the way a real node gets them (AWS_* variables)."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "flightdeck-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "flightdeck-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3(s3_endpoint).create_bucket(Bucket=name)
    return name


def s3(endpoint: str) -> Any:
    return boto3.session.Session().client("s3", endpoint_url=endpoint)


def keys(endpoint: str, bucket: str) -> set[str]:
    listed = s3(endpoint).list_objects_v2(Bucket=bucket)
    return {item["Key"] for item in listed.get("Contents", [])}


@pytest.fixture
def nodes(tmp_path: Path, s3_endpoint: str, bucket: str) -> tuple[dict, dict]:
    """Settings of two nodes: their own homes, one SQLite database and one bucket between them."""
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 'flightdeck.db'}"
    upgrade(url)

    def node(name: str) -> dict:
        return {
            "home": str(tmp_path / name),
            "database_url": url,
            "storage_url": f"s3://{bucket}/{PREFIX}",
            "storage_endpoint_url": s3_endpoint,
            "scheduler": False,
            "demo_models": False,
            "auth_reads": False,
            "warmup_max_sequence": 16,
        }

    return node("a"), node("b")


@contextmanager
def registry_of(config: dict) -> Iterator[Registry]:
    """A node's registry built from its settings, as the CLI and the app build it."""
    settings = load_settings(environ={}, overrides=config)
    engine = make_engine(settings.sqlalchemy_url)
    try:
        yield Registry.for_settings(session_factory(engine), settings)
    finally:
        engine.dispose()


@contextmanager
def running(config: dict) -> Iterator[Flask]:
    """A node: the whole app (engine, reconciler) over its settings; its first reconcile pass is done on return."""
    from controlplane.app import create_app

    app = create_app(config)
    app.testing = True
    try:
        yield app
    finally:
        app.extensions["flightdeck"].shutdown(5)


def archive(version: str) -> bytes:
    return make_tar(good_members(add_model(), add_manifest(version=version)))


def push(app: Flask, data: bytes, headers: dict[str, str]) -> dict:
    form = {"archive": (io.BytesIO(data), "adder.tar.gz")}
    answer = app.test_client().post("/api/models", data=form, headers=headers, content_type="multipart/form-data")
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()


def deploy(app: Flask, version: str, headers: dict[str, str]) -> None:
    answer = app.test_client().post("/api/models/adder/deploy", json={"version": version}, headers=headers)
    assert answer.status_code == 202, answer.get_json()


def test_a_version_pushed_through_one_node_is_served_by_another(
    nodes: tuple[dict, dict], s3_endpoint: str, bucket: str
) -> None:
    config_a, config_b = nodes
    data = archive("1")
    sha = hashlib.sha256(data).hexdigest()
    with running(config_a) as app_a, running(config_b) as app_b:
        operator = token_for(app_a, Role.OPERATOR)
        assert push(app_a, data, operator)["sha256"] == sha
        stored = {f"{PREFIX}/adder/1/{sha}/{name}" for name in ("archive.tar.gz", "model.onnx", "manifest.json")}
        assert keys(s3_endpoint, bucket) == stored
        pushed = s3(s3_endpoint).get_object(Bucket=bucket, Key=f"{PREFIX}/adder/1/{sha}/archive.tar.gz")
        assert pushed["Body"].read() == data
        assert not (Path(config_a["home"]) / "registry").exists()  # nothing on node A's disk but its cache
        deploy(app_a, "1", operator)

        # Node B never saw the push: it finds the version in the shared database, and its files in the bucket.
        app_b.extensions["flightdeck"].reconciler.reconcile()  # NOTE: a pass now, not whenever its poll comes
        x = [[1.0, 2.0, 3.0, 4.0]]
        request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": sum(x, [])}]}
        answer = app_b.test_client().post("/v2/models/adder/infer", json=request)
        assert answer.status_code == 200, answer.get_json()
        assert np.allclose(answer.get_json()["outputs"][0]["data"], (np.array(x) + WEIGHTS).ravel())
        cached = Path(config_b["home"]) / "cache" / "models" / sha / "model.onnx"
        assert cached.read_bytes() == add_model().SerializeToString()
        assert not (Path(config_b["home"]) / "registry").exists()


def test_a_damaged_or_missing_cached_file_is_fetched_again(
    nodes: tuple[dict, dict], s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    config_a, config_b = nodes
    (tmp_path / "adder.tar.gz").write_bytes(archive("1"))
    model_bytes = add_model().SerializeToString()
    with registry_of(config_a) as registry_a, registry_of(config_b) as registry_b:
        row, created = registry_a.push(tmp_path / "adder.tar.gz", "alice")
        assert created
        folder = registry_b.folder(row)
        assert (
            folder.is_relative_to(Path(config_b["home"]) / "cache")
            and (folder / "model.onnx").read_bytes() == model_bytes
        )

        damaged = bytearray(model_bytes)
        damaged[-1] ^= 0xFF  # same size, other bytes
        (folder / "model.onnx").write_bytes(bytes(damaged))
        assert (registry_b.folder(row) / "model.onnx").read_bytes() == model_bytes

        (folder / "manifest.json").unlink()
        assert (registry_b.folder(row) / "manifest.json").is_file()

        index = folder.with_name(f"{row.sha256}.json")  # the per-file SHA-256s noted when the copy was made
        index.write_text("{")
        assert (registry_b.folder(row) / "model.onnx").read_bytes() == model_bytes
        assert registry_b.storage.cache.check(row.sha256) is None

        # Damaged, and the bucket cannot give it again: an error, and the damaged copy is gone, never served.
        (folder / "model.onnx").write_bytes(bytes(damaged))
        s3(s3_endpoint).delete_object(Bucket=bucket, Key=f"{PREFIX}/adder/1/{row.sha256}/archive.tar.gz")
        with pytest.raises(StorageUnavailable, match="is missing from the object store"):
            registry_b.folder(row)
        assert not folder.exists()
        # Node A's own copy (kept from the push) is whole and still serves.
        assert (registry_a.folder(row) / "model.onnx").read_bytes() == model_bytes


def test_an_archive_altered_in_the_bucket_is_refused(
    nodes: tuple[dict, dict], s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    config_a, config_b = nodes
    (tmp_path / "adder.tar.gz").write_bytes(archive("1"))
    with registry_of(config_a) as registry_a, registry_of(config_b) as registry_b:
        row, _ = registry_a.push(tmp_path / "adder.tar.gz", "alice")
        key = f"{PREFIX}/adder/1/{row.sha256}/archive.tar.gz"
        s3(s3_endpoint).put_object(Bucket=bucket, Key=key, Body=archive("2"))  # a valid archive, other bytes
        with pytest.raises(StorageUnavailable, match=f"not {row.sha256} as recorded at push"):
            registry_b.folder(row)
        cache = Path(config_b["home"]) / "cache" / "models"
        assert not (cache / row.sha256).exists()
        assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # no fill left half-done


def test_a_version_missing_from_the_bucket_fails_to_load_with_its_reason(
    nodes: tuple[dict, dict], s3_endpoint: str, bucket: str
) -> None:
    config_a, config_b = nodes
    with running(config_a) as app_a:
        operator = token_for(app_a, Role.OPERATOR)
        sha = push(app_a, archive("1"), operator)["sha256"]
        s3(s3_endpoint).delete_object(Bucket=bucket, Key=f"{PREFIX}/adder/1/{sha}/archive.tar.gz")
        deploy(app_a, "1", operator)  # node A holds its own copy from the push: the deploy is accepted

    with running(config_b) as app_b:
        services = app_b.extensions["flightdeck"]
        assert services.engine.loaded("adder") == []  # nothing half-served
        with services.sessions() as session:
            query = select(SlotStatus).where(SlotStatus.process == services.reconciler.process)
            status = {(s.model, s.slot): (s.version, s.state, s.error) for s in session.scalars(query)}
        version, state, error = status[("adder", "blue")]
        assert (version, state) == ("1", "failed")
        assert f"s3://{bucket}/{PREFIX}/adder/1/{sha}/archive.tar.gz is missing from the object store" in error
        assert app_b.test_client().get("/v2/models/adder/ready").status_code != 200
        # Asking node B to deploy it again is refused with the reason, before any desired state is written.
        again = app_b.test_client().post(
            "/api/models/adder/deploy", json={"version": "1"}, headers=token_for(app_b, Role.ADMIN)
        )
        assert again.status_code == 502 and "missing from the object store" in again.get_json()["error"]["message"]
        assert not (Path(config_b["home"]) / "cache" / "models" / sha).exists()


def test_delete_removes_the_objects_and_a_refused_push_stores_none(
    nodes: tuple[dict, dict], s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    config_a, _ = nodes
    with registry_of(config_a) as registry:
        (tmp_path / "bad.tar.gz").write_bytes(make_tar(good_members(add_model(), add_manifest(golden="no"))))
        with pytest.raises(Exception, match="golden"):
            registry.push(tmp_path / "bad.tar.gz", "alice")
        assert keys(s3_endpoint, bucket) == set()

        (tmp_path / "adder.tar.gz").write_bytes(archive("1"))
        row, _ = registry.push(tmp_path / "adder.tar.gz", "alice")
        assert len(keys(s3_endpoint, bucket)) == 3
        registry.delete("adder", "1", "alice")
        assert keys(s3_endpoint, bucket) == set()
        assert not (Path(config_a["home"]) / "cache" / "models" / row.sha256).exists()


def test_storage_url_is_parsed_and_checked_at_load() -> None:
    assert parse_storage_url("") is None
    assert parse_storage_url("s3://models") == StorageUrl("models", "")
    assert parse_storage_url("s3://my.models-1/team/a/") == StorageUrl("my.models-1", "team/a")
    for bad in ("gs://models", "s3://", "s3://Models", "s3://m/../x", "s3://models/a b"):
        with pytest.raises(ConfigError, match="FLIGHTDECK_STORAGE_URL"):
            load_settings(environ={"FLIGHTDECK_STORAGE_URL": bad})
    with pytest.raises(ConfigError, match="FLIGHTDECK_STORAGE_ENDPOINT_URL"):
        load_settings(environ={"FLIGHTDECK_STORAGE_ENDPOINT_URL": "minio:9000"})


def test_without_a_storage_url_versions_stay_on_the_local_disk(tmp_path: Path) -> None:
    with registry_of({"home": str(tmp_path / "home")}) as registry:
        assert isinstance(registry.storage, LocalStorage)


def test_a_node_drops_its_copies_of_versions_deleted_through_another(nodes: tuple[dict, dict], tmp_path: Path) -> None:
    config_a, config_b = nodes
    rows = {}
    with registry_of(config_a) as registry_a, registry_of(config_b) as registry_b:
        for version in ("1", "2"):
            (tmp_path / f"{version}.tar.gz").write_bytes(archive(version))
            rows[version], _ = registry_a.push(tmp_path / f"{version}.tar.gz", "alice")
            registry_b.folder(rows[version])
        registry_a.delete("adder", "1", "alice")
        assert registry_b.folder(rows["2"]).is_dir()
        assert registry_b.prune_copies() == [rows["1"].sha256]
        cache = Path(config_b["home"]) / "cache" / "models"
        assert not (cache / rows["1"].sha256).exists() and not (cache / f"{rows['1'].sha256}.json").exists()
        assert registry_b.storage.cache.check(rows["2"].sha256) is None  # the version still stored is untouched


def test_a_node_drops_unused_copies_no_deployment_names_and_every_lock_file_with_its_copy(
    nodes: tuple[dict, dict], tmp_path: Path
) -> None:
    config_a, config_b = nodes
    rows = {}
    with registry_of(config_a) as registry_a, registry_of(config_b) as registry_b:
        for version in ("1", "2", "3"):
            (tmp_path / f"{version}.tar.gz").write_bytes(archive(version))
            rows[version], _ = registry_a.push(tmp_path / f"{version}.tar.gz", "alice")
            registry_b.folder(rows[version])
        cache, root = registry_b.storage.cache, Path(config_b["home"]) / "cache" / "models"
        digests = {v: rows[v].sha256 for v in rows}
        assert {p.name for p in root.glob("*.lock")} == {f"{d}.lock" for d in digests.values()}
        registry_a.delete("adder", "3", "alice")
        # Version 1 is deployed; 2 is only in the registry. Both were used just now: both stay.
        keep, wanted = {digests["1"], digests["2"]}, {digests["1"]}
        assert cache.prune(keep, wanted) == [digests["3"]]
        later = time.time() + 601  # ten minutes on, nobody having used version 2 since
        assert cache.prune(keep, wanted, now=later) == [digests["2"]]
        assert {p.name for p in root.iterdir()} == {digests["1"], f"{digests['1']}.json", f"{digests['1']}.lock"}
        assert cache.check(digests["1"]) is None
        registry_b.folder(rows["2"])  # deployed again: fetched again, whole
        assert cache.check(digests["2"]) is None


def test_an_evict_waits_for_a_fill_in_progress_then_takes_the_lock_file_with_the_copy(
    nodes: tuple[dict, dict], tmp_path: Path
) -> None:
    config_a, config_b = nodes
    (tmp_path / "adder.tar.gz").write_bytes(archive("1"))
    with registry_of(config_a) as registry_a, registry_of(config_b) as registry_b:
        row, _ = registry_a.push(tmp_path / "adder.tar.gz", "alice")
        cache, digest = registry_b.storage.cache, row.sha256
        filling, release, fetched = threading.Event(), threading.Event(), []

        def fetch(dest: Path) -> None:  # the pushed archive's very bytes, as the bucket holds them
            fetched.append(dest)
            shutil.copyfile(tmp_path / "adder.tar.gz", dest)

        def slow_fetch(dest: Path) -> None:
            filling.set()
            release.wait(10)
            fetch(dest)

        first = threading.Thread(target=cache.get, args=(digest, slow_fetch, "adder 1"))
        first.start()
        assert filling.wait(10)  # the first fill holds the entry's lock
        evicting = threading.Thread(target=cache.evict, args=(digest,))
        evicting.start()
        release.set()
        first.join(10)
        evicting.join(10)
        # The evict ran after the fill (it waited on the lock) and took the lock file with it.
        assert cache.check(digest) == "not cached" and not (cache.root / f"{digest}.lock").exists()
        assert cache.get(digest, fetch, "adder 1").is_dir()
        assert cache.check(digest) is None and (cache.root / f"{digest}.lock").exists() and len(fetched) == 2


def test_threads_asking_for_one_version_at_once_fetch_it_once(nodes: tuple[dict, dict], tmp_path: Path) -> None:
    config_a, config_b = nodes
    (tmp_path / "adder.tar.gz").write_bytes(archive("1"))
    with registry_of(config_a) as registry_a, registry_of(config_b) as registry_b:
        row, _ = registry_a.push(tmp_path / "adder.tar.gz", "alice")
        client = registry_b.storage.client()
        downloads: list[str] = []
        # boto3's own event hook: counts the GETs node B really sends for the archive.
        client.meta.events.register(
            "before-parameter-build.s3.GetObject",
            lambda params, **_: downloads.append(params["Key"]),
            unique_id="count-gets",
        )
        start = threading.Barrier(4)

        def load() -> Path:
            start.wait()
            return registry_b.folder(row)

        with ThreadPoolExecutor(4) as pool:
            folders = list(pool.map(lambda _: load(), range(4)))
        assert len(set(folders)) == 1 and (folders[0] / "model.onnx").read_bytes() == add_model().SerializeToString()
        assert downloads == [f"{PREFIX}/adder/1/{row.sha256}/archive.tar.gz"]
