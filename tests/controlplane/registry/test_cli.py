"""`registry build|push|list|show|delete` through Click's runner, against a real migrated database."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from sqlalchemy import select

from controlplane.models import AuditEvent
from controlplane.registry.cli import registry
from tests.controlplane.registry.conftest import add_manifest, add_model


@pytest.fixture
def cli_env(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    return home


def token_sum_model() -> bytes:
    """y[b, 0] = sum of ids[b, :] over INT64 [batch, seq]: a model with a sequence axis."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["ids_f", "axes"], ["y"], keepdims=1),
        ],
        "token_sum",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_build_push_list_show_delete(cli_env: Path, tmp_path: Path, sessions) -> None:
    runner = CliRunner()
    onnx_path, golden = tmp_path / "add.onnx", tmp_path / "golden.json"
    onnx_path.write_bytes(add_model().SerializeToString())
    golden.write_text(json.dumps(add_manifest()["golden"]))
    archive = tmp_path / "adder-1.tar.gz"
    args = [
        str(onnx_path),
        str(archive),
        "--name",
        "adder",
        "--version",
        "1",
        "--max-batch",
        "8",
        "--golden",
        str(golden),
    ]
    built = runner.invoke(registry, ["build", *args])
    assert built.exit_code == 0, built.output
    assert built.output.split()[-1] == hashlib.sha256(archive.read_bytes()).hexdigest()

    pushed = runner.invoke(registry, ["push", str(archive)])
    assert pushed.exit_code == 0, pushed.output
    assert "adder 1 pushed" in pushed.output
    assert "already there" in runner.invoke(registry, ["push", str(archive)]).output
    listed = runner.invoke(registry, ["list"])
    assert listed.exit_code == 0 and "adder" in listed.output and "cli:" in listed.output
    shown = json.loads(runner.invoke(registry, ["show", "adder", "1"]).output)
    assert shown["golden"] == {"samples": 1, "passed": True} and shown["manifest"]["batching"] == {"max_batch_size": 8}
    missing = runner.invoke(registry, ["show", "adder", "9"])
    assert missing.exit_code != 0 and "has no version '9'" in missing.output and "Traceback" not in missing.output

    deleted = runner.invoke(registry, ["delete", "adder", "1", "--yes"])
    assert deleted.exit_code == 0 and "deleted adder 1" in deleted.output
    assert "the registry is empty" in runner.invoke(registry, ["list"]).output
    with sessions() as session:
        audit = [
            (e.actor_kind, e.action, e.outcome) for e in session.scalars(select(AuditEvent).order_by(AuditEvent.id))
        ]
    assert audit == [("cli", "model.push", "ok"), ("cli", "model.push", "ok"), ("cli", "model.delete", "ok")]


def test_build_with_a_sequence_input(cli_env: Path, tmp_path: Path) -> None:
    onnx_path = tmp_path / "tokens.onnx"
    onnx_path.write_bytes(token_sum_model())
    archive = tmp_path / "tokens.tar.gz"
    args = ["--name", "tokens", "--version", "2026.11", "--sequence-input", "ids:1:0", "--sequence-buckets", "8,4"]
    built = CliRunner().invoke(registry, ["build", str(onnx_path), str(archive), *args])
    assert built.exit_code == 0, built.output
    pushed = CliRunner().invoke(registry, ["push", str(archive)])
    assert pushed.exit_code == 0, pushed.output
    shown = json.loads(CliRunner().invoke(registry, ["show", "tokens", "2026.11"]).output)["manifest"]
    assert shown["inputs"] == [
        {"name": "ids", "datatype": "INT64", "shape": [-1, -1], "sequence_axis": 1, "pad_value": 0}
    ]
    assert shown["batching"] == {"sequence_buckets": [4, 8]}


def test_build_refuses_what_a_push_would_refuse(cli_env: Path, tmp_path: Path) -> None:
    onnx_path, golden = tmp_path / "add.onnx", tmp_path / "golden.json"
    onnx_path.write_bytes(add_model().SerializeToString())
    samples = add_manifest()["golden"]
    samples[0]["outputs"]["y"]["data"][0] = 100.0
    golden.write_text(json.dumps(samples))
    archive = tmp_path / "bad.tar.gz"
    result = CliRunner().invoke(
        registry, ["build", str(onnx_path), str(archive), "--name", "adder", "--version", "1", "--golden", str(golden)]
    )
    assert result.exit_code != 0 and "the archive would be refused: golden samples do not match" in result.output
    assert not archive.exists()
    bad_flag = CliRunner().invoke(
        registry, ["build", str(onnx_path), str(archive), "--name", "adder", "--version", "1", "--sequence-input", "x"]
    )
    assert bad_flag.exit_code == 2 and "NAME:AXIS:PAD" in bad_flag.output
    not_an_input = CliRunner().invoke(
        registry,
        ["build", str(onnx_path), str(archive), "--name", "adder", "--version", "1", "--sequence-input", "ids:1:0"],
    )
    assert not_an_input.exit_code == 1 and "are not graph inputs" in not_an_input.output


def test_build_and_push_report_progress_on_stderr(cli_env: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    onnx_path, golden = tmp_path / "add.onnx", tmp_path / "golden.json"
    onnx_path.write_bytes(add_model().SerializeToString())
    golden.write_text(json.dumps(add_manifest()["golden"] * 3))
    archive = tmp_path / "adder-1.tar.gz"
    args = ["build", str(onnx_path), str(archive), "--name", "adder", "--version", "1", "--golden", str(golden)]
    built = runner.invoke(registry, args)
    assert built.exit_code == 0, built.output
    assert built.stdout.split()[-1] == hashlib.sha256(archive.read_bytes()).hexdigest()  # stdout stays one line
    full = "[" + "#" * 24 + "]"
    assert built.stderr.splitlines() == [
        f"unpacking       {full} 1/1",
        f"checks          {full} 4/4",
        f"golden samples  {full} 3/3",
    ]
    pushed = runner.invoke(registry, ["push", str(archive)])
    assert pushed.exit_code == 0, pushed.output
    size_mb = archive.stat().st_size / 1e6
    assert pushed.stderr.splitlines() == [
        f"hashing         {full} {size_mb:.1f}/{size_mb:.1f} MB",
        f"unpacking       {full} 1/1",
        f"checks          {full} 4/4",
        f"golden samples  {full} 3/3",
    ]
    assert pushed.stdout.startswith("adder 1 pushed")


def test_a_refused_push_ends_its_progress_and_says_why(cli_env: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a gzip archive at all")
    refused = CliRunner().invoke(registry, ["push", str(broken)])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert refused.stderr.splitlines()[-1].startswith("Error: archive is corrupt or truncated")
