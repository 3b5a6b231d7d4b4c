"""The drift API over history rows with known contents: scores, the default and pinned references, the gauge."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import select

from controlplane.history import drift
from controlplane.models import AuditEvent, SlotSample
from serving import inputstats

LABELS = {"logits": {"0": 60, "1": 30, "2": 10}}


def summaries(values: list[float]) -> dict:
    found: dict = {}
    inputstats.add_values(found, [("input", values)])
    return found


def row(ts: datetime, values: list[float], labels: dict = LABELS, version: str = "1") -> SlotSample:
    return SlotSample(
        ts=ts, resolution_s=0, interval_s=10.0, process="p1", model="mlp", version=version, slot="blue",
        successes=len(values), errors=0, client_errors=0, timeouts=0, rejections=0, latency_hist={}, latency_sum_s=0.0,
        queue_depth_max=0, queue_depth_mean=0.0, batches=len(values), batch_sizes={}, real_tokens=0, padded_tokens=0,
        label_counts=labels, input_summaries=summaries(values),
    )  # fmt: skip


def history(app, now: datetime) -> None:
    """Day one (three days ago): inputs around 1; the last half hour: inputs around 3, the same answers."""
    rng = np.random.default_rng(1)
    with app.extensions["flightdeck"].sessions() as session, session.begin():
        for minute in range(6):
            session.add(row(now - timedelta(days=3) + timedelta(minutes=minute), rng.normal(1, 0.1, 100).tolist()))
        for minute in range(3):
            session.add(row(now - timedelta(minutes=30 - minute), rng.normal(3, 0.1, 100).tolist()))


def test_scores_show_the_moved_input_against_the_first_day_and_the_steady_answers(app, client) -> None:
    now = datetime.now(UTC)
    history(app, now)
    answer = client.get("/api/models/mlp/drift?window=1h").get_json()
    (version,) = answer["versions"]
    assert version["version"] == "1" and version["reference"]["source"] == "first_day"
    scores = {s["kind"]: s for s in version["scores"]}
    assert scores["input"]["name"] == "input" and scores["input"]["score"] > 0.9  # no overlap left
    assert abs(scores["input"]["mean"] - 3) < 0.05 and abs(scores["input"]["reference_mean"] - 1) < 0.05
    assert scores["predictions"]["score"] == 0.0 and scores["predictions"]["p_value"] == 1.0
    assert scores["predictions"]["samples"] == 300 and scores["predictions"]["reference_samples"] == 600
    series = client.get("/api/models/mlp/drift/series?version=1&start=-1h&step=600").get_json()
    points = {s["labels"]["kind"]: s["points"] for s in series["series"]}
    assert len(points["input"]) == 6 and points["input"][0][1] is None  # nothing an hour ago
    scored = [p[1] for p in points["input"] if p[1] is not None]  # the half hour ago's rows (one or two steps)
    assert scored and all(score > 0.9 for score in scored)
    charted = app.extensions["flightdeck"].history.drift_series(now - timedelta(hours=1), now, 300, "mlp")
    assert {(s["labels"]["version"], s["labels"]["kind"]) for s in charted} == {("1", "input"), ("1", "predictions")}
    assert client.get("/api/models/mlp/drift?window=forever").status_code == 400


def test_pinning_a_reference_needs_an_operator_and_is_audited(app, client, operator, viewer) -> None:
    now = datetime.now(UTC)
    history(app, now)
    url = "/api/models/mlp/versions/1/drift-reference"
    recent = {"start": "-40m", "end": "now"}
    assert client.put(url, json=recent, headers=viewer).status_code == 403
    refused = client.put(url, json={"start": "now", "end": "-1h"}, headers=operator)
    assert refused.status_code == 400 and "must be before 'end'" in refused.get_json()["error"]["message"]
    quiet = client.put(url, json={"start": "-2d", "end": "-1d"}, headers=operator)
    assert quiet.status_code == 400 and "answered no request" in quiet.get_json()["error"]["message"]
    assert client.put("/api/models/mlp/versions/9/drift-reference", json=recent, headers=operator).status_code == 404
    pinned = client.put(url, json=recent, headers=operator)
    assert pinned.status_code == 200 and pinned.get_json()["source"] == "pinned"
    assert pinned.get_json()["pinned_by"] == "otto"
    # Against the last half hour itself, nothing has moved.
    scores = client.get("/api/models/mlp/drift?window=1h").get_json()["versions"][0]["scores"]
    assert all(s["score"] == 0.0 for s in scores)
    assert client.delete(url, headers=operator).get_json() == {"removed": True}
    assert client.get("/api/models/mlp/drift").get_json()["versions"][0]["reference"]["source"] == "first_day"
    with app.extensions["flightdeck"].sessions() as session:
        events = session.scalars(select(AuditEvent).where(AuditEvent.action.like("drift.%")).order_by(AuditEvent.id))
        seen = [(e.action, e.outcome, e.actor) for e in events]
    assert seen[0] == ("drift.pin_reference", "denied", "vic")
    assert ("drift.pin_reference", "ok", "otto") in seen and seen[-1] == ("drift.unpin_reference", "ok", "otto")
    assert sum(1 for s in seen if s[1] == "error" or (s[1] == "denied" and s[2] == "otto")) == 3  # the refusals


def test_the_leader_publishes_flightdeck_drift_score(app, client) -> None:
    now = datetime.now(UTC)
    history(app, now)
    assert drift.publish_scores(app.extensions["flightdeck"].sessions, timedelta(hours=1)) == 2
    text = client.get("/metrics").get_data(as_text=True)
    lines = [line for line in text.splitlines() if line.startswith("flightdeck_drift_score{")]
    assert any('kind="input"' in line and 'model="mlp"' in line and 'name="input"' in line for line in lines), lines
    assert any('kind="predictions"' in line and 'name="logits"' in line for line in lines), lines


def test_rolled_up_rows_score_as_the_raw_rows_did(sessions) -> None:
    """Retention merges input summaries and labels like latency histograms: the scores do not move."""
    from controlplane.history.retention import RetentionPolicy, apply_retention

    now = datetime.now(UTC)
    rng = np.random.default_rng(2)
    with sessions() as session, session.begin():
        for minute in range(6):
            session.add(row(now - timedelta(days=3) + timedelta(minutes=minute), rng.normal(1, 0.3, 50).tolist()))
        for minute in range(6):
            session.add(row(now - timedelta(days=1, hours=2, minutes=minute), rng.normal(1.5, 0.3, 50).tolist()))
    window = (now - timedelta(days=1, hours=4), now - timedelta(days=1))
    with sessions() as session:
        before = drift.drift(session, "mlp", "1", *window)
    with sessions() as session:
        apply_retention(session, now, RetentionPolicy(raw=timedelta(hours=1), minute=timedelta(days=1)))
    with sessions() as session:
        assert {r.resolution_s for r in session.scalars(select(SlotSample))} == {3600}  # every row rolled up twice
        after = drift.drift(session, "mlp", "1", *window)
    # The same counts, so the same scores; sums of squares may differ in the last digit (another order of adding).
    assert [(s.kind, s.name, s.score, s.samples, s.reference_samples) for s in after[1]] == [
        (s.kind, s.name, s.score, s.samples, s.reference_samples) for s in before[1]
    ]
    assert after[1][1].reference_std == pytest.approx(before[1][1].reference_std) and before[1][1].score > 0.2


def test_the_cli_prints_the_same_scores(app, home, monkeypatch) -> None:
    import json

    from click.testing import CliRunner

    from controlplane.cli import cli

    history(app, datetime.now(UTC))
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    runner = CliRunner()
    shown = runner.invoke(cli, ["drift", "mlp"])
    assert shown.exit_code == 0, shown.output
    assert "v1 (reference: first_day" in shown.output and re.search(r"input:input\s+1\.000\s+300 samples", shown.output)
    found = json.loads(runner.invoke(cli, ["drift", "mlp", "--window", "-2h", "--json"]).output)
    assert [s["score"] for s in found["versions"][0]["scores"] if s["kind"] == "input"] == [pytest.approx(1.0)]
    refused = runner.invoke(cli, ["drift", "mlp", "--window", "yesterday"])
    assert refused.exit_code == 2 and "'window' must be 'now', a relative time" in refused.output


def test_noise_on_images_moves_their_spread_not_their_mean() -> None:
    """Gaussian noise leaves an image's mean where it was; its `.std` feature is what shows it."""
    from controlplane.history.query import SlotAggregate

    rng = np.random.default_rng(3)
    scenes = rng.uniform(0.2, 0.8, (200, 3, 1, 1)) * np.ones((1, 1, 32, 32))  # flat colour patches
    clean, noisy = SlotAggregate(), SlotAggregate()
    for images, into in ((scenes[:100], clean), (scenes[100:] + rng.normal(0, 0.2, (100, 3, 32, 32)), noisy)):
        inputstats.add_values(into.inputs, inputstats.features_of({"pixels": images.astype(np.float32)}, 100))
    scores = {s.name: s for s in drift.compare(noisy, clean)}
    assert scores["pixels"].score < 0.1 and abs(scores["pixels"].mean - scores["pixels"].reference_mean) < 0.05
    assert scores["pixels.std"].score > 0.5
