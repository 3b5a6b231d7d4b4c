"""The sampler writes what really happened in the engine, one row per slot per interval."""

from __future__ import annotations

from prometheus_client import REGISTRY
from sqlalchemy import func, select

from controlplane.metricsflush import flush_all
from controlplane.models import DeviceSample, SlotSample

REQUESTS = "flightdeck_inference_requests_total"

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


def test_requests_the_model_refuses_are_client_errors_never_server_errors(app, client) -> None:
    services = app.extensions["flightdeck"]
    services.sampler.sample()

    def text(ids: list[int]) -> dict:
        shape = [1, len(ids)]
        return {
            "inputs": [
                {"name": "input_ids", "shape": shape, "datatype": "INT64", "data": ids},
                {"name": "attention_mask", "shape": shape, "datatype": "INT64", "data": [1] * len(ids)},
            ]
        }

    def counted() -> dict[str, float]:
        flush_all()  # per-request counts wait in memory until a flush (at most metricsflush.FLUSH_INTERVAL_S)
        labels = {"model": "textcls", "version": "1", "slot": "blue"}
        counts = {o: REGISTRY.get_sample_value(REQUESTS, {**labels, "outcome": o}) for o in ("client_error", "error")}
        invalid = REGISTRY.get_sample_value(
            REQUESTS, {"model": "textcls", "version": "", "slot": "", "outcome": "invalid"}
        )
        return {**counts, "invalid": invalid or 0.0}

    before = counted()
    assert client.post("/v2/models/textcls/infer", json=text([5, 6, 7])).status_code == 200
    refused = client.post("/v2/models/textcls/infer", json=text([5, 999_999_999]))
    assert refused.status_code == 400 and "999999999" in refused.get_json()["error"]
    services.sampler.sample()
    with services.sessions() as session:
        row = session.scalars(select(SlotSample).where(SlotSample.model == "textcls", SlotSample.successes > 0)).one()
        assert (row.successes, row.errors, row.client_errors) == (1, 0, 1)
    after = counted()
    (stats,) = client.get("/v2/models/textcls/stats").get_json()["model_stats"]
    assert stats["inference_stats"]["fail"]["count"] == stats["client_errors"] == 1  # Triton's "fail" counts both
    # Counted once, as the slot's client error: not as a server error, nor again as refused before a slot.
    assert {k: after[k] - before[k] for k in after} == {"client_error": 1.0, "error": 0.0, "invalid": 0.0}


def test_every_refused_request_is_a_client_error_of_its_kind_in_history_and_metrics(app, client) -> None:
    from controlplane.metrics import CLIENT_ERRORS

    services = app.extensions["flightdeck"]
    services.sampler.sample()
    labels = {"model": "mlp", "version": "1", "slot": "blue"}

    def by_kind() -> dict[str, float]:
        flush_all()
        kinds = ("shape", "datatype", "unknown_input", "malformed", "not_found", "too_large")
        found = {k: REGISTRY.get_sample_value(f"{CLIENT_ERRORS._name}_total", {**labels, "reason": k}) for k in kinds}
        found["client_error"] = REGISTRY.get_sample_value(REQUESTS, {**labels, "outcome": "client_error"})
        found["invalid"] = REGISTRY.get_sample_value(
            REQUESTS, {"model": "mlp", "version": "", "slot": "", "outcome": "invalid"}
        )
        return {k: v or 0.0 for k, v in found.items()}

    def tensor(shape: list[int], datatype: str = "FP32", name: str = "input") -> dict:
        return {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": [0] * (shape[0] * shape[-1])}]}

    before = by_kind()
    refusals = [
        ("/v2/models/mlp/infer", tensor([1, 63])),  # shape, refused by the version it was routed to
        ("/v2/models/mlp/infer", tensor([1, 64], "INT32")),  # datatype
        ("/v2/models/mlp/infer", tensor([1, 64], name="pixels")),  # unknown_input (and "input" missing)
        ("/v2/models/mlp/infer", b'{"inputs": ['),  # malformed, refused before the engine
        ("/v2/models/mlp/versions/9/infer", tensor([1, 64])),  # not_found: a version not loaded
    ]
    for path, body in refusals:
        response = client.post(path, data=body if isinstance(body, bytes) else None, json=None if isinstance(body, bytes) else body,
                               content_type="application/json")  # fmt: skip
        assert response.status_code in (400, 404), response.get_json()
    services.sampler.sample()
    with services.sessions() as session:
        (row,) = session.scalars(select(SlotSample).where(SlotSample.model == "mlp", SlotSample.client_errors > 0))
    assert (row.successes, row.errors, row.client_errors) == (0, 0, 5)
    assert row.client_error_kinds == {"datatype": 1, "malformed": 1, "not_found": 1, "shape": 1, "unknown_input": 1}
    after = by_kind()
    assert {k: after[k] - before[k] for k in after} == {
        "shape": 1.0, "datatype": 1.0, "unknown_input": 1.0, "malformed": 1.0, "not_found": 1.0, "too_large": 0.0,
        "client_error": 5.0, "invalid": 0.0,
    }  # fmt: skip
    (stats,) = client.get("/v2/models/mlp/stats").get_json()["model_stats"]
    assert stats["inference_stats"]["fail"]["count"] == stats["client_errors"] == 5 and stats["execution_count"] == 0


def test_predicted_labels_are_kept_per_version_and_exported_with_compute_time_per_batch_size(app, client) -> None:
    services = app.extensions["flightdeck"]
    services.sampler.sample()
    rows = [[0.5] * 64, [-0.5] * 64, [0.25 * (i % 5) for i in range(64)], [1.0] * 32 + [-1.0] * 32]
    body = {"inputs": [{"name": "input", "shape": [4, 64], "datatype": "FP32", "data": sum(rows, [])}]}

    def exported() -> dict[str, float]:
        flush_all()
        found = {}
        for metric in REGISTRY.collect():
            for sample in metric.samples:
                if (
                    sample.name == "flightdeck_prediction_label_total"
                    and sample.labels["model"] == "mlp"
                    and sample.labels["version"] == "1"
                ):
                    assert set(sample.labels) == {"model", "version", "output", "label"}
                    found[sample.labels["label"]] = sample.value
        return found

    before = exported()
    answer = client.post("/v2/models/mlp/infer", json=body).get_json()
    scores = answer["outputs"][0]["data"]
    top = [str(max(range(10), key=lambda c, r=r: scores[r * 10 + c])) for r in range(4)]  # arg-max per sample
    services.sampler.sample()
    with services.sessions() as session:
        row = session.scalars(select(SlotSample).where(SlotSample.model == "mlp", SlotSample.successes > 0)).one()
    expected = {label: top.count(label) for label in set(top)}
    assert row.label_counts == {"probabilities": expected}
    assert list(row.compute_hist) == ["4"] and sum(row.compute_hist["4"].values()) == 1  # one batch of four
    after = exported()
    assert {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)} == expected
