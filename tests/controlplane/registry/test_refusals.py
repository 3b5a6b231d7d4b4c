"""Every bad archive is refused with a message naming the reason, and leaves nothing behind."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from controlplane.errors import ApiError
from controlplane.registry.service import Registry
from tests.controlplane.registry.conftest import (
    LIMITS,
    WEIGHTS,
    add_manifest,
    add_model,
    assert_nothing_kept,
    good_members,
    make_tar,
    member,
)


def with_extra(*extra: tuple) -> bytes:
    return make_tar([*good_members(), *extra])


def truncated() -> bytes:
    data = make_tar(good_members())
    return data[: len(data) // 2]


def bad_crc() -> bytes:
    data = bytearray(make_tar(good_members()))
    data[-8] ^= 0xFF  # the gzip trailer's CRC-32
    return bytes(data)


def unchecked_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "missing"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return make_tar(good_members(model, add_manifest(golden=[])))


def unloadable_model() -> bytes:
    # The checker accepts an op from a domain it has no schema for; ONNX Runtime has no kernel for it.
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return make_tar(good_members(model, add_manifest(golden=[])))


def golden_mismatch() -> bytes:
    manifest = add_manifest()
    manifest["golden"][0]["outputs"]["y"]["data"][2] += 0.5
    return make_tar(good_members(manifest=manifest))


def external(location: str, *extra: tuple) -> bytes:
    return make_tar([*good_members(add_model(location)), *extra])


def manifest_with(**changes) -> bytes:
    return make_tar(good_members(manifest=add_manifest(**changes)))


BIG = LIMITS.max_unpacked_bytes

CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "path traversal": (lambda: with_extra(member("../x", b"evil")), "'..' component (path traversal)"),
    "nested traversal": (lambda: with_extra(member("weights/../../x", b"evil")), "'..' component"),
    "absolute path": (lambda: with_extra(member("/tmp/evil", b"evil")), "has an absolute path"),
    "symlink": (
        lambda: with_extra(member("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")),
        "'link' is a symbolic link",
    ),
    "hardlink": (
        lambda: with_extra(member("hard", kind=tarfile.LNKTYPE, linkname="model.onnx")),
        "'hard' is a hard link",
    ),
    "character device": (lambda: with_extra(member("tty", kind=tarfile.CHRTYPE)), "is a device or FIFO"),
    "fifo": (lambda: with_extra(member("pipe", kind=tarfile.FIFOTYPE)), "is a device or FIFO"),
    "oversized member": (
        lambda: make_tar([member("big.bin", bytes(BIG + 1)), *good_members()]),
        f"'big.bin' is {BIG + 1} bytes, over the limit of {BIG} (FLIGHTDECK_MAX_UNPACKED_BYTES)",
    ),
    "unpacked total over the limit": (
        lambda: with_extra(*(member(f"part{i}.bin", bytes(BIG // 2)) for i in range(3))),
        f"unpacks to more than {BIG} bytes",
    ),
    "too many files": (
        lambda: with_extra(*(member(f"f{i}.txt", b"x") for i in range(LIMITS.max_files))),
        f"more than {LIMITS.max_files} entries (FLIGHTDECK_MAX_ARCHIVE_FILES)",
    ),
    "corrupt gzip": (lambda: b"this is not a gzip stream " * 40, "corrupt or truncated"),
    "gzip but not tar": (lambda: gzip.compress(b"hello " * 200), "corrupt or truncated"),
    "truncated archive": (truncated, "corrupt or truncated"),
    "bad gzip checksum": (bad_crc, "corrupt or truncated"),
    "missing manifest": (lambda: make_tar(good_members()[:1]), "no manifest.json at its top level"),
    "nested manifest": (
        lambda: make_tar([good_members()[0], member("sub/manifest.json", b"{}")]),
        "found 'sub/manifest.json'; it must be at the top level",
    ),
    "second model.onnx": (lambda: with_extra(member("./model.onnx", b"other")), "'model.onnx' twice"),
    "manifest not JSON": (
        lambda: make_tar([good_members()[0], member("manifest.json", b"{name: adder")]),
        "manifest.json: is not valid JSON",
    ),
    "bad model name": (lambda: manifest_with(name="Adder!"), "manifest.json: field 'name': must match ^[a-z0-9]"),
    "manifest inputs the graph lacks": (
        lambda: manifest_with(inputs=[{"name": "features", "datatype": "FP32", "shape": [-1, 4]}], golden=[]),
        "declared inputs ['features'] but the graph has ['x']",
    ),
    "wrong datatype declared": (
        lambda: manifest_with(inputs=[{"name": "x", "datatype": "INT64", "shape": [-1, 4]}], golden=[]),
        "input 'x' declared INT64 but the graph has FP32",
    ),
    "unknown datatype": (
        lambda: manifest_with(inputs=[{"name": "x", "datatype": "FLOAT", "shape": [-1, 4]}], golden=[]),
        "manifest.json: field 'inputs[0].datatype': must be one of ['BOOL',",
    ),
    "pad value without a sequence axis": (
        lambda: manifest_with(inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 4], "pad_value": 0}], golden=[]),
        "manifest.json: field 'inputs[0].pad_value': input 'x' has a pad_value but no sequence_axis",
    ),
    "external data outside the archive": (lambda: external("../outside.bin"), "outside the archive"),
    "external data at an absolute path": (lambda: external("/etc/passwd"), "not a relative path"),
    "external data the archive lacks": (lambda: external("weights.bin"), "which the archive lacks"),
    "not an ONNX file": (
        lambda: make_tar([member("model.onnx", b"\x00garbage" * 8), good_members()[1]]),
        "model.onnx is not an ONNX model",
    ),
    "ONNX that fails the checker": (unchecked_model, "model.onnx fails the ONNX checker"),
    "ONNX that ONNX Runtime cannot load": (unloadable_model, "ONNX Runtime cannot load model.onnx"),
    "golden mismatch": (golden_mismatch, "golden samples do not match the model: golden sample 0: output 'y'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_archive_is_refused_and_leaves_nothing(case: str, registry: Registry, home: Path, sessions) -> None:
    build, reason = CASES[case]
    with pytest.raises(ApiError) as refused:
        registry.push(io.BytesIO(build()), "tester")
    assert refused.value.status == 400
    assert reason in refused.value.message
    assert "unpacked-" not in refused.value.message  # no server paths in what the pusher sees
    assert_nothing_kept(home, sessions)


def test_an_archive_over_the_size_limit_is_413(registry: Registry, home: Path, sessions) -> None:
    noise = np.random.default_rng(0).bytes(LIMITS.max_archive_bytes + 1)
    with pytest.raises(ApiError) as refused:
        registry.push(io.BytesIO(noise), "tester")
    assert refused.value.status == 413
    assert f"over the limit of {LIMITS.max_archive_bytes} bytes (FLIGHTDECK_MAX_ARCHIVE_BYTES)" in refused.value.message
    assert_nothing_kept(home, sessions)


def test_a_wrong_expected_hash_names_both(registry: Registry, home: Path, sessions) -> None:
    data = make_tar(good_members())
    actual = hashlib.sha256(data).hexdigest()
    with pytest.raises(ApiError) as refused:
        registry.push(io.BytesIO(data), "tester", expected_sha256="ab" * 32)
    assert refused.value.code == "sha256_mismatch"
    assert actual in refused.value.message and "ab" * 32 in refused.value.message
    assert_nothing_kept(home, sessions)


def test_external_data_inside_the_archive_is_kept_with_plain_modes(registry: Registry, home: Path) -> None:
    folder_entry = member("weights", kind=tarfile.DIRTYPE, mode=0o000)
    data = external("weights/w.bin", folder_entry, member("weights/w.bin", WEIGHTS.tobytes(), mode=0o4777))
    row, created = registry.push(io.BytesIO(data), "tester")
    assert created and row.golden_passed is True
    folder = registry.folder(row)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "archive.tar.gz",
        "manifest.json",
        "model.onnx",
        "weights/w.bin",
    ]
    assert not any(os.path.islink(p) for p in folder.rglob("*"))
    assert (folder / "weights").stat().st_mode & 0o7777 == 0o755
    assert (folder / "weights" / "w.bin").stat().st_mode & 0o7777 == 0o644
    assert list((home / "tmp").iterdir()) == []


def test_manifest_without_golden_samples_is_kept_with_no_golden_result(registry: Registry) -> None:
    row, _ = registry.push(io.BytesIO(manifest_with(golden=[])), "tester")
    assert row.golden_passed is None
    assert json.loads((registry.folder(row) / "manifest.json").read_text())["golden"] == []
