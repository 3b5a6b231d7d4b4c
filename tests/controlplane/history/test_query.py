"""Series and summaries from recorded rows: sums across processes, merged histograms, empty steps."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.history import query
from tests.controlplane.history.conftest import T0, latencies, minutes, slot_row


def test_percentiles_come_from_merged_buckets_across_rows_and_processes(sessions) -> None:
    parts = [latencies(i, 400, median_s=0.005 * (i + 1)) for i in range(6)]
    with sessions() as s, s.begin():
        for i, part in enumerate(parts):
            s.add(slot_row(T0 + minutes(1) * (i // 2) + minutes(0.1), part, process=f"p{i % 2}"))
    everything = np.concatenate(parts)
    with sessions() as s:
        (line,) = query.summary(s, T0, T0 + minutes(5))
    assert line["requests"] == 2400
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        exact = np.quantile(everything, q, method="inverted_cdf") * 1000
        assert abs(line[name] / exact - 1) < 0.1
    per_row_p99 = np.mean([np.quantile(p, 0.99) for p in parts]) * 1000
    assert abs(line["p99"] - per_row_p99) > 0.1 * per_row_p99  # averaging would have been wrong


def test_series_buckets_by_step_sums_processes_and_leaves_empty_steps_empty(sessions) -> None:
    with sessions() as s, s.begin():
        s.add(slot_row(T0 + minutes(0.5), latencies(1, 60), errors=6, process="p1"))
        s.add(slot_row(T0 + minutes(0.5), latencies(2, 60), timeouts=0, rejections=20, process="p2"))
        s.add(slot_row(T0 + minutes(2.5), latencies(3, 30)))
        s.add(slot_row(T0 + minutes(0.5), latencies(4, 10), version="2", slot="green"))
    with sessions() as s:
        throughput = query.series(s, "throughput", T0, T0 + minutes(3), 60)
        errors = query.series(s, "error_rate", T0, T0 + minutes(3), 60, version="1")
        rejected = query.series(s, "rejection_rate", T0, T0 + minutes(3), 60, slot="blue")
    assert [x["labels"] for x in throughput] == [
        {"model": "textcls", "version": "1", "slot": "blue"},
        {"model": "textcls", "version": "2", "slot": "green"},
    ]
    blue = throughput[0]["points"]
    assert [p[0] for p in blue] == [(T0 + minutes(m)).isoformat() for m in (1, 2, 3)]
    assert blue[0][1] == pytest.approx(120 / 60) and blue[1][1] is None and blue[2][1] == pytest.approx(30 / 60)
    assert errors[0]["points"][0][1] == pytest.approx(6 / 140)  # requests include the 20 refused
    assert rejected[0]["points"][0][1] == pytest.approx(20 / 140)


def test_client_errors_are_requests_but_never_server_errors(sessions) -> None:
    with sessions() as s, s.begin():
        s.add(slot_row(T0 + minutes(0.5), latencies(1, 100), errors=2, client_errors=30))
    with sessions() as s:
        (line,) = query.summary(s, T0, T0 + minutes(1))
        throughput = query.series(s, "throughput", T0, T0 + minutes(1), 60)[0]["points"][0][1]
    assert line["requests"] == 100
    assert line["error_rate"] == pytest.approx(2 / 100) and line["client_error_rate"] == pytest.approx(30 / 100)
    assert throughput == pytest.approx(100 / 60)  # a 400 from the model is an answered request


def test_batch_sizes_padding_and_queue(sessions) -> None:
    with sessions() as s, s.begin():
        s.add(
            slot_row(T0 + minutes(0.2), latencies(1, 40), batches={"8": 4, "4": 2}, tokens=(700, 1000), queue=(9, 3.0))
        )
        s.add(slot_row(T0 + minutes(0.4), latencies(2, 8), batches={"8": 1}, tokens=(300, 300), queue=(2, 1.0)))
    with sessions() as s:
        mean = query.series(s, "batch_size_mean", T0, T0 + minutes(1), 60)[0]["points"][0][1]
        waste = query.series(s, "padding_waste", T0, T0 + minutes(1), 60)[0]["points"][0][1]
        qmax = query.series(s, "queue_depth_max", T0, T0 + minutes(1), 60)[0]["points"][0][1]
        qmean = query.series(s, "queue_depth_mean", T0, T0 + minutes(1), 60)[0]["points"][0][1]
        (dist,) = query.batch_distribution(s, T0, T0 + minutes(1))
    assert mean == pytest.approx((8 * 5 + 4 * 2) / 7)
    assert waste == pytest.approx((1300 - 1000) / 1300)
    assert qmax == 9 and qmean == pytest.approx((3.0 * 10 + 1.0 * 10) / 60)
    assert dist["counts"] == {"4": 2, "8": 5}


def test_unknown_metric_is_a_key_error(sessions) -> None:
    with sessions() as s, pytest.raises(KeyError):
        query.series(s, "p42", T0, T0 + minutes(1), 60)
