"""The sampler writes what really happened in the engine, one row per slot per interval."""

from __future__ import annotations

from sqlalchemy import func, select

from controlplane.models import DeviceSample, SlotSample

BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def test_rows_count_the_requests_of_the_interval_and_nothing_before(app, client) -> None:
    services = app.extensions["flightdeck"]
    for _ in range(7):
        assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
    bad = {
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}],
        "outputs": [{"name": "nope"}],
    }
    assert client.post("/v2/models/mlp/infer", json=bad).status_code == 400
    assert services.sampler.sample() >= 2
    with services.sessions() as session:
        rows = {(r.model, r.slot): r for r in session.scalars(select(SlotSample))}
        assert rows[("mlp", "blue")].successes == 7
        assert rows[("mlp", "blue")].errors == rows[("mlp", "blue")].timeouts == 0
        assert sum(rows[("mlp", "blue")].latency_hist.values()) == 7
        assert rows[("mlp", "blue")].batches == 7 and rows[("mlp", "blue")].batch_sizes == {"1": 7}
        assert rows[("textcls", "blue")].successes == 0  # warm-up is not traffic
        assert rows[("mlp", "blue")].interval_s > 0
        cpu = session.scalars(select(DeviceSample).where(DeviceSample.device == "cpu")).one()
        assert cpu.reserved_bytes > 0 and cpu.in_use_bytes > 0 and 0 <= cpu.fragmentation <= 1
    services.sampler.sample()
    with services.sessions() as session:
        counts = session.execute(
            select(func.count(), func.sum(SlotSample.successes)).where(SlotSample.model == "mlp")
        ).one()
    assert tuple(counts) == (2, 7)  # the second interval adds a row, not the same requests again


def test_a_replaced_version_gets_its_last_row_and_the_new_one_counts_from_its_load(app, client, demo_store) -> None:
    services = app.extensions["flightdeck"]
    services.sampler.sample()
    for _ in range(3):
        client.post("/v2/models/mlp/infer", json=BODY)
    services.engine.load(demo_store / "mlp" / "2", "blue")  # replaces v1 in blue between two samples
    for _ in range(2):
        client.post("/v2/models/mlp/infer", json=BODY)
    services.sampler.sample()
    with services.sessions() as session:
        totals = dict(
            session.execute(
                select(SlotSample.version, func.sum(SlotSample.successes))
                .where(SlotSample.model == "mlp")
                .group_by(SlotSample.version)
            ).all()
        )
    assert totals == {"1": 3, "2": 2}
