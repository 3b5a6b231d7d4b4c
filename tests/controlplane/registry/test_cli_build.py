"""`registry build` derives batching from the graph and takes flags for a model's own configuration."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.registry.cli import registry
from tests.signature_models import write_image, write_vad


@pytest.fixture
def cli_env(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    return home


def built_manifest(archive: Path) -> dict:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return json.loads(member.read())


def build(onnx_file: Path, out: Path, *flags: str):
    return CliRunner().invoke(registry, ["build", str(onnx_file), str(out), *flags])


def test_a_scalar_model_builds_with_max_batch_size_0_and_a_scalar_warm_up(cli_env: Path, tmp_path: Path) -> None:
    onnx_file = write_vad(tmp_path / "src") / "model.onnx"
    out = tmp_path / "vad.tar.gz"
    flags = ["--name", "vad", "--version", "5", "--max-queue-size", "16", "--default-timeout-ms", "500"]
    warm = ["--warmup-input", "input:1x512:random", "--warmup-input", "state:2x1x8", "--warmup-input", "sr::ones"]
    result = build(onnx_file, out, *flags, *warm)
    assert result.exit_code == 0, result.output
    manifest = built_manifest(out)
    assert manifest["batching"] == {"max_batch_size": 0, "max_queue_size": 16, "default_timeout_ms": 500.0}
    assert [t["shape"] for t in manifest["inputs"]] == [[-1, -1], [2, -1, 8], []]
    assert manifest["warmup"] == [
        {
            "inputs": {
                "input": {"shape": [1, 512], "fill": "random"},
                "state": {"shape": [2, 1, 8]},
                "sr": {"shape": [], "fill": "ones"},
            }
        }
    ]


def test_an_image_model_builds_batched_with_the_flags_given(cli_env: Path, tmp_path: Path) -> None:
    onnx_file = write_image(tmp_path / "src") / "model.onnx"
    out = tmp_path / "image.tar.gz"
    flags = ["--name", "image", "--version", "1", "--max-batch", "8", "--preferred-batch-sizes", "2,4"]
    flags += ["--max-queue-delay-ms", "3", "--instances", "2", "--warmup-input", "image:2x3x32x24:random"]
    result = build(onnx_file, out, *flags)
    assert result.exit_code == 0, result.output
    assert built_manifest(out)["batching"] == {
        "max_batch_size": 8,
        "max_queue_delay_ms": 3.0,
        "preferred_batch_sizes": [2, 4],
        "instances": 2,
    }


def test_a_build_the_push_would_refuse_leaves_no_archive(cli_env: Path, tmp_path: Path) -> None:
    onnx_file = write_image(tmp_path / "src") / "model.onnx"
    out = tmp_path / "image.tar.gz"
    # A warm-up image the 3x3 convolution refuses, and a scalar model forced to batch.
    result = build(onnx_file, out, "--name", "image", "--version", "1", "--warmup-input", "image:1x3x1x1")
    assert result.exit_code != 0 and "a declared warm-up sample fails to run" in result.output
    assert not out.exists()
    vad = write_vad(tmp_path / "vad") / "model.onnx"
    result = build(vad, out, "--name", "vad", "--version", "1", "--max-batch", "4")
    assert (
        result.exit_code != 0
        and "field 'inputs[1].shape': input 'state' must have a dynamic batch axis" in result.output
    )
    result = build(vad, out, "--name", "vad", "--version", "1", "--warmup-input", "sr:1x2x3x:zeros")
    assert result.exit_code != 0 and "DIMS must be integers joined by x" in result.output
    assert not out.exists()
