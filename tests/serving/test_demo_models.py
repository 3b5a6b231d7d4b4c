"""Tests for the deterministic demo ONNX models in serving.demo_models."""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from serving import demo_models as dm
from serving.golden import check_golden

_ORT_TYPES = {"INT64": "tensor(int64)", "FP32": "tensor(float)"}


@pytest.fixture(scope="module")
def models() -> dict[tuple[str, str], onnx.ModelProto]:
    # Building textcls takes ~0.5 s, so build every (name, version) once per module.
    return {(n, v): dm.build_model(n, v) for n in dm.DEMO_MODELS for v in dm.DEMO_VERSIONS}


@pytest.fixture(scope="module")
def sessions(models: dict[tuple[str, str], onnx.ModelProto]) -> dict[tuple[str, str], ort.InferenceSession]:
    return {
        key: ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for key, model in models.items()
    }


def _textcls_inputs(seqs: list[np.ndarray]) -> dict[str, np.ndarray]:
    # Right-pad with pad id 0 / mask 0 to the longest sequence.
    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _random_tokens(rng: np.random.Generator, length: int) -> np.ndarray:
    return rng.integers(1, 30000, size=length, dtype=np.int64)


def test_checker_and_metadata(models: dict[tuple[str, str], onnx.ModelProto]) -> None:
    for (_name, version), model in models.items():
        onnx.checker.check_model(model)
        assert model.producer_name == "flightdeck-demo"
        assert model.model_version == int(version)
        assert model.doc_string
        assert {o.domain: o.version for o in model.opset_import}[""] == 17


@pytest.mark.parametrize("name", dm.DEMO_MODELS)
def test_rebuild_is_byte_identical(name: str, models: dict[tuple[str, str], onnx.ModelProto]) -> None:
    first = hashlib.sha256(models[(name, "1")].SerializeToString()).hexdigest()
    again = hashlib.sha256(dm.build_model(name, "1").SerializeToString()).hexdigest()
    other = hashlib.sha256(models[(name, "2")].SerializeToString()).hexdigest()
    assert first == again
    assert first != other


def test_versions_differ_in_outputs(sessions: dict[tuple[str, str], ort.InferenceSession]) -> None:
    rng = np.random.default_rng(1)
    feeds = {
        "textcls": _textcls_inputs([_random_tokens(rng, 12), _random_tokens(rng, 7)]),
        "mlp": {"input": rng.standard_normal((4, 64), dtype=np.float32)},
    }
    for name, feed in feeds.items():
        out1 = sessions[(name, "1")].run(None, feed)[0]
        out2 = sessions[(name, "2")].run(None, feed)[0]
        assert np.abs(out1 - out2).max() > 1e-3, name


@pytest.mark.parametrize("name", dm.DEMO_MODELS)
@pytest.mark.parametrize("version", dm.DEMO_VERSIONS)
def test_session_signature_matches_manifest(
    name: str, version: str, sessions: dict[tuple[str, str], ort.InferenceSession]
) -> None:
    manifest = dm.demo_manifest(name, version)
    session = sessions[(name, version)]
    for spec_list, args in ((manifest["inputs"], session.get_inputs()), (manifest["outputs"], session.get_outputs())):
        assert [s["name"] for s in spec_list] == [a.name for a in args]
        for spec, arg in zip(spec_list, args):
            assert arg.type == _ORT_TYPES[spec["datatype"]]
            assert len(arg.shape) == len(spec["shape"])
            for want, got in zip(spec["shape"], arg.shape):
                # -1 in the manifest must be a symbolic (dynamic) dim in the graph.
                assert isinstance(got, str) if want == -1 else got == want
            assert arg.shape[0] == "batch"


def test_manifest_shape() -> None:
    text = dm.demo_manifest("textcls", "2")
    assert set(text) == {"name", "version", "platform", "inputs", "outputs", "batching", "metadata", "golden"}
    assert (text["name"], text["version"], text["platform"]) == ("textcls", "2", "onnxruntime_onnx")
    assert all(i["sequence_axis"] == 1 and i["pad_value"] == 0 for i in text["inputs"])
    assert text["batching"] == {"max_batch_size": 32, "sequence_buckets": [16, 32, 64, 128, 256, 512]}
    assert text["metadata"]["labels"] == ["negative", "neutral", "positive"]
    assert text["metadata"]["vocab_size"] == 30000 and text["metadata"]["max_sequence_length"] == 512
    mlp = dm.demo_manifest("mlp", "1")
    assert mlp["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert mlp["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]
    assert mlp["batching"] == {"max_batch_size": 64}
    assert mlp["metadata"]["description"]


@pytest.mark.parametrize("name", dm.DEMO_MODELS)
@pytest.mark.parametrize("version", dm.DEMO_VERSIONS)
def test_golden_samples_pass_on_the_model_and_fail_on_the_other_version(
    name: str, version: str, sessions: dict[tuple[str, str], ort.InferenceSession]
) -> None:
    manifest = dm.demo_manifest(name, version)
    golden = manifest["golden"]
    assert len(golden) == 2 and all(s["atol"] == 1e-4 and s["rtol"] == 1e-3 for s in golden)
    assert {n for s in golden for n in s["inputs"]} == {i["name"] for i in manifest["inputs"]}
    assert len(json.dumps(golden)) < 8000, "golden samples keep the manifest small"

    def runner(session: ort.InferenceSession):
        return lambda feed: dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))

    assert check_golden(manifest, runner(sessions[(name, version)])) == []
    other = "2" if version == "1" else "1"
    failures = check_golden(manifest, runner(sessions[(name, other)]))
    assert len(failures) == 2 and all("differs" in f for f in failures)


def test_golden_samples_are_the_same_in_another_process() -> None:
    code = "import json; from serving import demo_models as dm; print(json.dumps(dm.demo_manifest('mlp', '1')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out)["golden"] == dm.demo_manifest("mlp", "1")["golden"]


@pytest.mark.parametrize("version", dm.DEMO_VERSIONS)
def test_textcls_padding_invariance(version: str, sessions: dict[tuple[str, str], ort.InferenceSession]) -> None:
    session = sessions[("textcls", version)]
    rng = np.random.default_rng(7)
    seqs = [_random_tokens(rng, n) for n in (5, 17, 40)]
    alone = np.concatenate([session.run(None, _textcls_inputs([s]))[0] for s in seqs])
    batched_feed = _textcls_inputs(seqs)
    assert batched_feed["input_ids"].shape == (3, 40)
    batched = session.run(None, batched_feed)[0]
    assert batched.shape == (3, 3)
    np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-4)
    # Control: attending to the pad tokens changes the logits, so the mask is what gives invariance.
    unmasked = session.run(None, {**batched_feed, "attention_mask": np.ones((3, 40), dtype=np.int64)})[0]
    assert np.abs(unmasked[:2] - alone[:2]).max() > 1e-3


def test_textcls_logits_vary_with_input(sessions: dict[tuple[str, str], ort.InferenceSession]) -> None:
    rng = np.random.default_rng(3)
    feed = _textcls_inputs([_random_tokens(rng, 32) for _ in range(6)])
    logits = sessions[("textcls", "1")].run(None, feed)[0]
    assert logits.shape == (6, 3) and np.isfinite(logits).all()
    assert logits.std(axis=0).min() > 1e-3
    assert len({tuple(np.round(row, 5)) for row in logits}) == 6
    # The dynamic dims also accept a larger batch and sequence length.
    big = _textcls_inputs([_random_tokens(rng, 128) for _ in range(8)])
    assert sessions[("textcls", "1")].run(None, big)[0].shape == (8, 3)


def test_mlp_probabilities(sessions: dict[tuple[str, str], ort.InferenceSession]) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 64), dtype=np.float32)
    for version in dm.DEMO_VERSIONS:
        probs = sessions[("mlp", version)].run(["probabilities"], {"input": x})[0]
        assert probs.shape == (16, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
        assert (probs >= 0).all()
        assert probs.max() < 0.99, "softmax should not be degenerate (one-hot)"
        assert probs.argmax(axis=1).tolist() != [probs.argmax(axis=1)[0]] * 16


def test_write_demo_models(tmp_path: pathlib.Path, models: dict[tuple[str, str], onnx.ModelProto]) -> None:
    dirs = dm.write_demo_models(tmp_path)
    expected = [tmp_path / n / v for n in dm.DEMO_MODELS for v in dm.DEMO_VERSIONS]
    assert dirs == expected
    for (name, version), vdir in zip([(n, v) for n in dm.DEMO_MODELS for v in dm.DEMO_VERSIONS], dirs):
        assert sorted(p.name for p in vdir.iterdir()) == ["manifest.json", "model.onnx"]  # no temp leftovers
        assert (vdir / "model.onnx").read_bytes() == models[(name, version)].SerializeToString()
        text = (vdir / "manifest.json").read_text()
        assert text == json.dumps(dm.demo_manifest(name, version), indent=2, sort_keys=True)
        onnx.checker.check_model(str(vdir / "model.onnx"))

    before = {p: p.stat().st_mtime_ns for d in dirs for p in d.iterdir()}
    assert dm.write_demo_models(tmp_path) == expected
    assert {p: p.stat().st_mtime_ns for d in dirs for p in d.iterdir()} == before


def test_write_demo_models_completes_partial_version(tmp_path: pathlib.Path) -> None:
    dm.write_demo_models(tmp_path)
    manifest = tmp_path / "mlp" / "2" / "manifest.json"
    manifest.unlink()
    untouched = tmp_path / "mlp" / "1" / "model.onnx"
    mtime = untouched.stat().st_mtime_ns
    dm.write_demo_models(tmp_path)
    assert json.loads(manifest.read_text())["version"] == "2"
    assert untouched.stat().st_mtime_ns == mtime


def test_unknown_model_name() -> None:
    with pytest.raises(ValueError):
        dm.build_model("resnet", "1")
    with pytest.raises(ValueError):
        dm.demo_manifest("resnet", "1")
