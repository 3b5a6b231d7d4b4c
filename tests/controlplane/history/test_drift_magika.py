"""Drift with a real public model: Magika fed another file type fires the drift alert; unshifted traffic does not.

Two copies of Google's Magika classifier (the wheel the public-model tests use) run in one real
engine on ONNX Runtime; the real sampler writes their history rows into a real SQLite file at times a
test clock chooses; the real evaluator runs the shipped drift rule over them. Both copies see the
same files of this repository during their first day (their default reference); a day later, over
the same hour, `magika-a` keeps seeing such files while `magika-b` is sent gzip-compressed ones.
"""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import onnx
import pytest
from sqlalchemy import select

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, load_rules
from alerts.states import AlertState
from controlplane.alerting.evaluator import AlertEvaluator, EvaluatorSettings
from controlplane.history import drift
from controlplane.history.sampler import HistorySampler
from controlplane.models import AlertRecord
from controlplane.registry.graph_manifest import manifest_from_graph
from serving.engine import Engine
from serving.settings import BatchingSettings, RuntimeSettings
from tests.controlplane.history.conftest import T0
from tests.public_models.catalogue import MAGIKA
from tests.public_models.inputs import ROOT, magika_features, magika_rows

RULES = Path(__file__).resolve().parents[3] / "alerts" / "rules"
PER_INTERVAL = 20  # requests per model per sampled interval


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self):
        return self.now


def version_folder(root: Path, name: str) -> Path:
    """Magika's graph as a served version: the wheel's .onnx and the manifest `registry build` would write."""
    folder = root / name / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").symlink_to(MAGIKA.path())
    manifest = manifest_from_graph(onnx.load(str(MAGIKA.path())), name=name, version="1", sequence_inputs={})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def gzip_rows() -> list[np.ndarray]:
    """Another file type: this repository's files gzip-compressed (no padding, bytes spread over 0..255)."""
    files = sorted(p for p in (ROOT / "controlplane").rglob("*.py") if p.stat().st_size > 6000)[:24]
    return [magika_features(gzip.compress(p.read_bytes(), mtime=0)) for p in files]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("magika")
    serving = Engine(
        RuntimeSettings(device="cpu", intra_op_threads=1),
        BatchingSettings(instances=1, input_sample_every=1, warmup_max_sequence=8),
    )
    for name in ("magika-a", "magika-b"):
        serving.load(version_folder(root, name), "blue")
    yield serving
    serving.drain(5)


def send(engine: Engine, model: str, rows, rng: np.random.Generator, n: int) -> None:
    for i in rng.integers(0, len(rows), n):
        engine.infer(model, {"bytes": rows[i][None]})


def test_gzip_files_fire_the_drift_alert_and_the_unshifted_copy_stays_quiet(engine, sessions) -> None:
    clock = Clock()
    sampler = HistorySampler(engine, sessions, "test", clock=clock)
    sampler.sample()  # from here on, rows count only the traffic below
    text, shifted = magika_rows(), gzip_rows()
    rng = np.random.default_rng(7)
    # Day one: both copies see files of this repository (their default reference: the first day).
    for minute in range(1, 7):
        for model in ("magika-a", "magika-b"):
            send(engine, model, text, rng, PER_INTERVAL)
        clock.now = T0 + timedelta(minutes=minute)
        sampler.sample()

    rules = [r for r in load_rules(RULES, [*METRICS, *LIVE_METRICS]) if r.name == "model_drift"]
    evaluator = AlertEvaluator(
        sessions, rules, EvaluatorSettings(), engine_ready=lambda: True, run_automatic=lambda r, a: "", clock=clock
    )
    # A day later, over the same hour: a keeps its mix, b gets gzip files. Sampled and evaluated every 5 minutes.
    day2 = T0 + timedelta(days=1, hours=1)
    for step in range(1, 7):
        send(engine, "magika-a", text, rng, PER_INTERVAL)
        send(engine, "magika-b", shifted, rng, PER_INTERVAL)
        clock.now = day2 + timedelta(minutes=5 * step)
        sampler.sample()
        evaluator.run()

    with sessions() as session:
        alerts = {(a.labels["model"], a.labels["feature"]): a for a in session.scalars(select(AlertRecord))}
        _, quiet = drift.drift(session, "magika-a", "1", clock.now - timedelta(hours=1), clock.now)
        _, moved = drift.drift(session, "magika-b", "1", clock.now - timedelta(hours=1), clock.now)
    firing = {key for key, a in alerts.items() if a.state == AlertState.FIRING}
    # Both what b answers and what it is asked (bytes' mean and spread) moved; the alert fired on each, after
    # its `for` of 15 minutes.
    wanted = {("magika-b", f) for f in ("predictions:target_label", "input:bytes", "input:bytes.std")}
    assert firing == wanted, {k: (a.state, a.value) for k, a in alerts.items()}
    assert all(a.firing_since - day2 >= timedelta(minutes=15) for a in alerts.values() if a.state == "firing")
    scores = {s.name: s for s in moved}
    assert scores["target_label"].score > 0.5 and scores["bytes"].score > 0.3
    assert scores["bytes"].mean > scores["bytes"].reference_mean  # compressed bytes: higher values on average
    # The copy whose traffic did not change scores low on everything, with as many samples behind it.
    assert all(s.score is not None and s.score < 0.1 for s in quiet), quiet
    assert {s.samples for s in quiet} == {s.reference_samples for s in quiet} == {6 * PER_INTERVAL}
