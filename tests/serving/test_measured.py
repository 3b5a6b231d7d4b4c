"""What a load measured, shared by the workers of a node (serving.measured).

Two engines on one measurements folder and one claim file stand in for two workers of one server:
the second one loads the same version with the first one's cost curve and lone-request decision,
timed once, and so shows the same limits in `/v2/models/{m}/config`.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import threading
from pathlib import Path

import pytest

from serving import engine as engine_module
from serving.batchcost import CostCurve
from serving.cores import CoreClaim
from serving.engine import Engine
from serving.measured import LOAD_LOCK, Measurements
from serving.modelconfig import triton_config
from serving.settings import BatchingSettings, RuntimeSettings
from tests.servers import wait_until
from tests.serving.test_cores import blocked_on


@pytest.fixture
def textcls(demo_store: Path) -> Path:
    return demo_store / "textcls" / "1"


def worker(tmp_path: Path, max_batch_size: int = 8, **runtime) -> Engine:
    """An engine as a worker of the node in `tmp_path` has one: learned limits, the node's claim and folder."""
    batching = BatchingSettings(learn_batch_limits=True, max_batch_size=max_batch_size, warmup_max_sequence=32)
    return Engine(
        RuntimeSettings(device="cpu", intra_op_threads=1, **runtime),
        batching,
        rng=random.Random(1),
        cores=CoreClaim(tmp_path / "cores.lock"),
        measured=Measurements(tmp_path / "measured"),
    )


def records(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "measured").glob("*.json"))]


def test_the_second_worker_loads_with_the_first_ones_cost_curve(textcls: Path, tmp_path: Path) -> None:
    first, second = worker(tmp_path), worker(tmp_path)
    try:
        one = first.load(textcls)
        two = second.load(textcls)
        assert one.config.cost_curve is not None
        # The same figures to the last digit: the first one's timings, read back, not a second timing.
        assert two.config.cost_curve == one.config.cost_curve
        assert (
            two.config.batch_limits == one.config.batch_limits and two.batcher.batch_limits == one.batcher.batch_limits
        )
        shown = [triton_config(v.spec, v.config, on_gpu=False)["parameters"] for v in (one, two)]
        assert shown[0]["batch_limits"] == shown[1]["batch_limits"]  # /v2/models/{m}/config, whichever worker
        (record,) = records(tmp_path)
        assert CostCurve.from_json(record["curve"]) == one.config.cost_curve
    finally:
        first.drain(5)
        second.drain(5)


def test_a_load_under_other_settings_measures_its_own(textcls: Path, tmp_path: Path) -> None:
    first, other = worker(tmp_path, max_batch_size=8), worker(tmp_path, max_batch_size=4)
    try:
        one = first.load(textcls)
        two = other.load(textcls)
        assert len(records(tmp_path)) == 2
        assert one.config.cost_curve is not None and two.config.cost_curve is not None
        assert max(b for points in two.config.cost_curve.points.values() for b, _ in points) <= 4
        assert two.config.cost_curve != one.config.cost_curve
    finally:
        first.drain(5)
        other.drain(5)


def test_an_unreadable_record_is_measured_again_and_replaced(textcls: Path, tmp_path: Path) -> None:
    first = worker(tmp_path)
    try:
        first.load(textcls)
    finally:
        first.drain(5)
    (path,) = (tmp_path / "measured").glob("*.json")
    for broken in ('{"curve": {"points": "not points"}}', "{not json", "[]"):
        path.write_text(broken)
        again = worker(tmp_path)
        try:
            loaded = again.load(textcls)
            assert loaded.config.cost_curve is not None
            assert CostCurve.from_json(json.loads(path.read_text())["curve"]) == loaded.config.cost_curve
        finally:
            again.drain(5)


def test_the_lone_request_decision_is_the_nodes(monkeypatch: pytest.MonkeyPatch, textcls: Path, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    timings: list[str] = []

    def timed(shared, alone, sample, budget) -> tuple[float, float]:
        timings.append("timed")
        return 2.0, 1.0  # NOTE: the machine's timing, given: the test is about who decides, not this VM's speed

    monkeypatch.setattr(engine_module, "lone_request_times", timed)
    first, second = worker(tmp_path, lone_request_session=True), worker(tmp_path, lone_request_session=True)
    try:
        one = first.load(textcls)
        two = second.load(textcls)
        assert timings == ["timed"]
        assert one.alone is not None and two.alone is not None
        assert two.config.lone_request_ms == one.config.lone_request_ms == {"shared": 2000.0, "alone": 1000.0}
        assert two.config.lone_request_threads == 2
    finally:
        first.drain(5)
        second.drain(5)
    # The node decided against it: a third worker loads no second session, and times nothing.
    (path,) = (tmp_path / "measured").glob("*.json")
    record = json.loads(path.read_text())
    path.write_text(json.dumps(record | {"lone": record["lone"] | {"kept": False}}))
    load_session = engine_module.load_session
    loaded_threads: list[int] = []
    monkeypatch.setattr(
        engine_module,
        "load_session",
        lambda model, runtime: loaded_threads.append(runtime.intra_op_threads) or load_session(model, runtime),
    )
    third = worker(tmp_path, lone_request_session=True)
    try:
        three = third.load(textcls)
        assert three.alone is None and three.config.lone_request_threads == 0
        assert loaded_threads == [1] and timings == ["timed"]
    finally:
        third.drain(5)


def test_a_worker_waits_for_the_one_loading_instead_of_timing_beside_it(
    monkeypatch: pytest.MonkeyPatch, textcls: Path, tmp_path: Path
) -> None:
    built: list[Path] = []
    load_session = engine_module.load_session
    monkeypatch.setattr(engine_module, "load_session", lambda m, r: built.append(m) or load_session(m, r))
    first = worker(tmp_path)
    try:
        curve = first.load(textcls).config.cost_curve
    finally:
        first.drain(5)
    assert curve is not None
    (path,) = (tmp_path / "measured").glob("*.json")
    record = json.loads(path.read_text())
    path.unlink()  # as if the first worker were still measuring: nothing written yet
    lock_file = tmp_path / "measured" / LOAD_LOCK
    lock = os.open(lock_file, os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # ... and holding the node's load lock, as it does while it loads
    second = worker(tmp_path)
    del built[:]
    loaded: list = []
    held = True
    thread = threading.Thread(target=lambda: loaded.append(second.load(textcls)))
    try:
        thread.start()
        wait_until(lambda: blocked_on(lock_file), 30, "the second load to wait on the node's load lock")
        assert built == []  # not even its session built: building and warm-up would take a core from the timings
        slower = CostCurve(
            {b: tuple((n, 10 * s) for n, s in points) for b, points in curve.points.items()},
            curve.limits, curve.margin, curve.seconds,
        )  # fmt: skip
        path.write_text(json.dumps(record | {"curve": slower.to_json()}))  # what the first one measured
        os.close(lock)
        held = False
        thread.join(60)
        assert loaded and loaded[0].config.cost_curve == slower  # read, not timed beside the first
    finally:
        if held:
            os.close(lock)
        thread.join(60)
        second.drain(5)


def test_a_record_is_written_whole_and_a_missing_folder_is_made(tmp_path: Path) -> None:
    store = Measurements(tmp_path / "node" / "measured")
    assert store.get("k") == {}
    store.put("k", {"curve": None})
    store.put("k", {"curve": None, "lone": {"kept": True}})
    assert store.get("k") == {"curve": None, "lone": {"kept": True}}
    assert [p.name for p in (tmp_path / "node" / "measured").iterdir()] == ["k.json"]  # no temporary left
