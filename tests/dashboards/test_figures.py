"""Plotly figures from recorded-looking history: traces, names, units, markers, empty data, JSON."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest

from dashboards.figures import FIGURES, METRICS, NO_DATA, build_dashboard, series_name
from dashboards.markers import GAP_PX, ROW_PX, ROWS, marker_decorations, pack_labels, read_markers

T0 = "2026-11-30T06:00:00+00:00"
BLUE = {"model": "textcls", "version": "1", "slot": "blue"}
GREEN = {"model": "textcls", "version": "2", "slot": "green"}
GPU = {"device": "gpu0"}
CPU = {"device": "cpu"}
RANGE = ("2026-11-30T05:00:00+00:00", "2026-11-30T06:01:00+00:00")
MARKERS = [
    {"time": "2026-11-30T06:00:20+00:00", "kind": "rollout", "text": "textcls v2: canary step 10%"},
    {"time": "2026-11-30T07:00:40+01:00", "kind": "alert", "text": "P1 textcls p99 > 250 ms"},
]


def points(*values: float | None) -> list[list]:
    """A series at 10 s steps from T0, as the history API returns it."""
    return [[f"2026-11-30T06:00:{10 * i:02d}+00:00", v] for i, v in enumerate(values)]


def slot_series(metric: str, scale: float) -> list[dict]:
    """Two versions of textcls with a gap in version 1, values distinct per metric."""
    base = (METRICS.index(metric) + 1) * scale
    return [
        {"labels": BLUE, "points": points(base, None, base * 2)},
        {"labels": GREEN, "points": points(base * 3, base * 4, base * 5)},
    ]


@pytest.fixture
def recorded() -> dict[str, list[dict]]:
    series = {m: slot_series(m, 0.01 if m.endswith(("_rate", "waste")) else 1.0) for m in METRICS}
    series["gpu_utilization"] = [{"labels": GPU, "points": points(0.5, 0.75, None)}]
    series["gpu_memory_used"] = [{"labels": GPU, "points": points(2 * 1024**3, 3 * 1024**3, None)}]
    series["fragmentation"] = [
        {"labels": GPU, "points": points(0.1, 0.2, 0.3)},
        {"labels": CPU, "points": points(0.05, None, 0.05)},
    ]
    return series


@pytest.fixture
def batches() -> list[dict]:
    return [
        {"labels": BLUE, "counts": {"16": 5, "1": 120, "8": 40, "2": 0}},
        {"labels": GREEN, "counts": {"4": 10}},
    ]


@pytest.fixture
def dashboard(recorded, batches) -> dict[str, dict]:
    return {f["id"]: f for f in build_dashboard(recorded, batches, MARKERS, time_range=RANGE)}


def traces_by_name(figure: dict) -> dict[str, dict]:
    return {t["name"]: t for t in figure["data"]}


def test_every_figure_in_order_with_id_and_title(recorded, batches) -> None:
    figures = build_dashboard(recorded, batches, MARKERS)

    assert [(f["id"], f["title"]) for f in figures] == list(FIGURES)
    assert {"throughput", "latency", "errors", "queue", "batch", "padding", "gpu", "fragmentation"} <= {
        f["id"] for f in figures
    }
    for figure in figures:
        assert figure["layout"]["title"]["text"] == figure["title"]


def test_figures_are_valid_plotly_and_plain_json(recorded, batches) -> None:
    recorded["throughput"][0]["points"][0][1] = math.nan  # a NaN must not leak into the JSON
    figures = build_dashboard(recorded, batches, MARKERS, time_range=RANGE)

    text = json.dumps(figures, allow_nan=False)
    for figure in json.loads(text):
        go.Figure(data=figure["data"], layout=figure["layout"])  # raises on any unknown property
    assert figures[0]["data"][0]["y"][0] is None


def test_throughput_has_one_trace_per_version_named_by_model_version_slot(dashboard) -> None:
    traces = traces_by_name(dashboard["throughput"])

    assert set(traces) == {"textcls v1 (blue)", "textcls v2 (green)"}
    blue = traces["textcls v1 (blue)"]
    assert blue["x"] == [p[0] for p in points(1, 2, 3)]
    assert blue["y"] == [1.0, None, 2.0]  # the gap stays a gap
    assert blue["connectgaps"] is False
    assert dashboard["throughput"]["layout"]["yaxis"]["title"]["text"] == "requests/s"


def test_latency_shows_p50_p90_p99_per_version_in_ms_with_dash_styles(dashboard) -> None:
    traces = traces_by_name(dashboard["latency"])

    assert set(traces) == {f"textcls v{v} ({s}) p{q}" for v, s in (("1", "blue"), ("2", "green")) for q in (50, 90, 99)}
    dashes = {name.rsplit(" ", 1)[1]: t["line"]["dash"] for name, t in traces.items()}
    assert dashes == {"p50": "dot", "p90": "dash", "p99": "solid"}
    assert traces["textcls v2 (green) p99"]["y"] == [v * (METRICS.index("p99") + 1) for v in (3, 4, 5)]
    assert dashboard["latency"]["layout"]["yaxis"]["title"]["text"] == "ms"
    assert all(t["hovertemplate"].endswith(" ms") for t in traces.values())


def test_a_version_keeps_its_colour_across_figures(dashboard) -> None:
    throughput = traces_by_name(dashboard["throughput"])
    latency = traces_by_name(dashboard["latency"])
    batch = traces_by_name(dashboard["batch"])

    for version in ("textcls v1 (blue)", "textcls v2 (green)"):
        colour = throughput[version]["line"]["color"]
        assert latency[f"{version} p99"]["line"]["color"] == colour
        assert batch[version]["marker"]["color"] == colour
    assert throughput["textcls v1 (blue)"]["line"]["color"] != throughput["textcls v2 (green)"]["line"]["color"]


def test_rates_are_percentages(dashboard) -> None:
    traces = traces_by_name(dashboard["errors"])

    assert {n.rsplit(" ", 1)[1] for n in traces} == {"errors", "client-errors", "timeouts", "rejections"}
    expected = 0.01 * (METRICS.index("error_rate") + 1) * 100
    assert traces["textcls v1 (blue) errors"]["y"][0] == pytest.approx(expected)
    assert dashboard["errors"]["layout"]["yaxis"]["ticksuffix"] == "%"
    assert traces_by_name(dashboard["padding"])["textcls v1 (blue)"]["y"][0] == pytest.approx(
        METRICS.index("padding_waste") + 1
    )
    assert dashboard["padding"]["layout"]["yaxis"]["ticksuffix"] == "%"


def test_queue_shows_max_and_mean(dashboard) -> None:
    assert set(traces_by_name(dashboard["queue"])) == {
        f"textcls v{v} ({s}) {k}" for v, s in (("1", "blue"), ("2", "green")) for k in ("max", "mean")
    }


def test_gpu_utilisation_in_percent_and_memory_in_gib_on_a_second_axis(dashboard) -> None:
    figure = dashboard["gpu"]
    traces = traces_by_name(figure)

    assert traces["gpu0 utilisation"]["y"] == [50.0, 75.0, None]
    assert traces["gpu0 utilisation"]["yaxis"] == "y"
    assert traces["gpu0 memory"]["y"] == [2.0, 3.0, None]
    assert traces["gpu0 memory"]["yaxis"] == "y2"
    assert figure["layout"]["yaxis2"]["overlaying"] == "y"
    assert "GiB" in figure["layout"]["yaxis2"]["title"]["text"]


def test_fragmentation_per_device(dashboard) -> None:
    traces = traces_by_name(dashboard["fragmentation"])

    assert set(traces) == {"gpu0", "cpu"}
    assert traces["cpu"]["y"] == [5.0, None, 5.0]


def test_batch_distribution_bars_sorted_by_size_with_shares(dashboard) -> None:
    figure = dashboard["batch"]
    blue = traces_by_name(figure)["textcls v1 (blue)"]

    assert figure["layout"]["xaxis"]["categoryarray"] == ["1", "2", "4", "8", "16"]
    assert blue["type"] == "bar"
    assert blue["x"] == ["1", "8", "16"]  # sizes it never ran are left out
    assert blue["y"] == [120, 40, 5]
    assert blue["customdata"] == [round(100 * n / 165, 2) for n in (120, 40, 5)]


def test_markers_on_every_time_series_figure(dashboard) -> None:
    for figure_id, figure in dashboard.items():
        lines = [s for s in figure["layout"].get("shapes", []) if s["type"] == "line"]
        labels = [a for a in figure["layout"]["annotations"] if a.get("name") in ("rollout", "alert")]
        if figure_id == "batch":  # not a time axis
            assert not lines and not labels
            continue
        assert [(s["x0"], s["name"]) for s in lines] == [
            ("2026-11-30T06:00:20", "rollout"),
            ("2026-11-30T06:00:40", "alert"),  # 07:00:40+01:00, in UTC
        ]
        assert all(s["yref"] == "paper" and (s["y0"], s["y1"]) == (0, 1) for s in lines)
        assert labels[0]["text"].startswith("textcls v2: canary")
        assert "P1 textcls p99 &gt; 250 ms" in labels[1]["hovertext"]
        assert lines[0]["line"]["color"] != lines[1]["line"]["color"]


def test_time_range_pins_the_time_axis(dashboard) -> None:
    assert dashboard["throughput"]["layout"]["xaxis"]["range"] == ["2026-11-30T05:00:00", "2026-11-30T06:01:00"]
    assert dashboard["throughput"]["layout"]["xaxis"]["type"] == "date"


def test_no_data_gives_an_annotated_empty_figure() -> None:
    figures = build_dashboard({}, [], [])

    assert [f["id"] for f in figures] == [f for f, _ in FIGURES]
    for figure in figures:
        assert figure["data"] == []
        assert [a["text"] for a in figure["layout"]["annotations"]] == [NO_DATA]
    json.dumps(figures, allow_nan=False)


def test_series_with_only_gaps_count_as_no_data(recorded) -> None:
    recorded["throughput"] = [{"labels": BLUE, "points": points(None, None)}]
    recorded["p50"] = recorded["p90"] = recorded["p99"] = []

    figures = {f["id"]: f for f in build_dashboard(recorded, [], MARKERS)}

    for figure_id in ("throughput", "latency", "batch"):
        assert figures[figure_id]["data"] == []
        assert NO_DATA in [a["text"] for a in figures[figure_id]["layout"]["annotations"]]
    assert len(figures["throughput"]["layout"]["shapes"]) == len(MARKERS)  # markers still shown
    assert figures["errors"]["data"]


def test_markers_without_a_readable_time_are_skipped(recorded) -> None:
    markers = [{"kind": "alert", "text": "no time"}, {"time": "yesterday", "kind": "alert"}, MARKERS[0]]

    figure = build_dashboard(recorded, [], markers)[0]

    assert [s["x0"] for s in figure["layout"]["shapes"]] == ["2026-11-30T06:00:20"]


def test_text_from_data_is_escaped_for_plotly_labels(recorded) -> None:
    hostile = {"model": "<b>x</b>", "version": "1", "slot": "blue"}
    recorded["throughput"] = [{"labels": hostile, "points": points(1.0)}]
    markers = [{"time": T0, "kind": "alert", "text": '<a href="javascript:alert(1)">click</a>'}]

    figure = build_dashboard(recorded, [], markers)[0]

    assert figure["data"][0]["name"] == "&lt;b&gt;x&lt;/b&gt; v1 (blue)"
    label = figure["layout"]["annotations"][0]
    assert "<" not in label["text"] and "<" not in label["hovertext"]


@pytest.mark.parametrize(
    ("labels", "name"),
    [
        (BLUE, "textcls v1 (blue)"),
        ({"model": "mlp", "version": "3"}, "mlp v3"),
        ({"model": "mlp"}, "mlp"),
        (GPU, "gpu0"),
        ({}, "all models"),
        ({"model": "mlp", "version": "2", "kind": "input", "name": "pixels"}, "mlp v2 input:pixels"),
    ],
)
def test_series_names(labels: dict, name: str) -> None:
    assert series_name(labels) == name


def test_dashboards_is_a_leaf() -> None:
    """Importing the package pulls in no web framework and no database layer."""
    code = (
        "import sys, dashboards.figures, dashboards.grafana; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'sqlalchemy', 'controlplane')); "
        "sys.exit(', '.join(bad) or None)"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def at(minute: int, second: int = 0, kind: str = "rollout", text: str = "") -> dict:
    """A marker inside RANGE, `minute` minutes after its start."""
    return {
        "time": f"2026-11-30T05:{minute:02d}:{second:02d}+00:00",
        "kind": kind,
        "text": text or f"m{minute}:{second}",
    }


def rows(annotations: list[dict]) -> list[int]:
    return [a["yshift"] // ROW_PX for a in annotations]


def test_far_apart_markers_keep_their_text_on_one_row() -> None:
    markers = [at(10, text="v2 at 10%"), at(30, kind="alert", text="P1 latency"), at(50, text="v2 at 50%")]

    decorations = marker_decorations(markers, RANGE)

    assert [a["text"] for a in decorations.annotations] == ["v2 at 10%", "P1 latency", "v2 at 50%"]
    assert rows(decorations.annotations) == [0, 0, 0]
    assert decorations.rows == 1
    assert [a["xanchor"] for a in decorations.annotations] == ["center"] * 3
    assert [s["x0"] for s in decorations.shapes] == [
        "2026-11-30T05:10:00",
        "2026-11-30T05:30:00",
        "2026-11-30T05:50:00",
    ]


def test_two_close_markers_go_to_two_rows() -> None:
    markers = [at(30, 20, kind="alert", text="P1 textcls p99 > 250 ms"), at(30, text="textcls v2: canary step 10%")]

    decorations = marker_decorations(markers, RANGE)

    # Sorted by time: the rollout first, on the bottom row; the alert 20 s later, one row up.
    assert [(a["text"], a["name"]) for a in decorations.annotations] == [
        ("textcls v2: canary step 10%", "rollout"),
        ("P1 textcls p99 &gt; 250 ms", "alert"),
    ]
    assert [a["yshift"] for a in decorations.annotations] == [0, ROW_PX]
    assert decorations.rows == 2
    assert len(decorations.shapes) == 2


def test_many_close_markers_merge_into_one_label_listing_every_marker() -> None:
    markers = [at(30, 5 * i, kind="alert" if i % 2 else "rollout", text=f"textcls step {i}: pass") for i in range(7)]

    decorations = marker_decorations(markers, RANGE)

    labels = decorations.annotations
    assert [a["text"] for a in labels] == ["textcls step 0: pass", "textcls step 1: pass", "5 events"]
    assert rows(labels) == list(range(ROWS))
    merged = labels[-1]
    assert merged["hovertext"].split("<br>") == [
        f"{'alert' if i % 2 else 'rollout'} at 2026-11-30T05:30:{5 * i:02d}: textcls step {i}: pass"
        for i in range(2, 7)
    ]
    assert merged["name"] == "events"  # rollouts and alerts together: neither's colour
    assert len(decorations.shapes) == 7  # still one line per marker
    assert decorations.rows == ROWS


def test_markers_outside_the_range_are_left_out_and_take_no_row() -> None:
    inside = at(30, text="textcls v2: canary step 10%")
    before = {"time": "2026-11-30T04:59:59+00:00", "kind": "alert", "text": "earlier"}
    after = {"time": "2026-11-30T08:00:00+01:00", "kind": "alert", "text": "later"}  # 07:00 UTC

    decorations = marker_decorations([before, inside, after], RANGE)

    assert [s["x0"] for s in decorations.shapes] == ["2026-11-30T05:30:00"]
    assert [(a["text"], a["yshift"]) for a in decorations.annotations] == [(inside["text"], 0)]
    assert marker_decorations([before, after], RANGE).rows == 0


def test_labels_at_the_edges_of_the_range_hang_inwards() -> None:
    markers = [at(0, text="textcls v2: canary step 10%"), {"time": RANGE[1], "kind": "alert", "text": "P1 at the end"}]

    decorations = marker_decorations(markers, RANGE)

    assert [a["xanchor"] for a in decorations.annotations] == ["left", "right"]


def test_packing_is_deterministic_and_never_overlaps_within_a_row() -> None:
    generator = random.Random(14)
    markers = [
        at(generator.randrange(61) if m < 60 else 0, generator.randrange(60), generator.choice(["rollout", "alert"]),
           "x" * generator.randrange(1, 40))
        for m in range(60)
    ]  # fmt: skip
    found = read_markers(markers, RANGE)
    start, end = (m.time for m in read_markers([{"time": t} for t in RANGE]))

    labels = pack_labels(found, start, end)

    assert [m for label in labels for m in label.members] == found  # every marker once, in time order
    for row in range(ROWS):
        spans = [(label.left, label.right) for label in labels if label.row == row]
        assert all(a[1] + GAP_PX <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    shuffled = markers[:]
    generator.shuffle(shuffled)
    assert marker_decorations(shuffled, RANGE) == marker_decorations(markers, RANGE)


def test_label_rows_get_room_under_the_title_and_the_legend_its_own_below_the_axis() -> None:
    for count in range(1, ROWS + 1):
        layout = build_dashboard({}, [], [at(30, 5 * i) for i in range(count)], time_range=RANGE)[0]["layout"]

        top_row = max(a.get("yshift", 0) for a in layout["annotations"]) + ROW_PX
        assert layout["margin"]["t"] - top_row >= 30  # the title's 30 px stay clear of the highest row
        assert layout["title"]["yref"] == "container" and layout["title"]["yanchor"] == "top"
    # Container-referenced, the legend's room comes on top of what the axis (ticks, title) pushes.
    assert layout["legend"]["yref"] == "container" and layout["xaxis"]["automargin"] is True


def test_drift_scores_per_version_and_feature_in_bits() -> None:
    labels = {"model": "magika", "version": "1", "kind": "predictions", "name": "target_label"}
    series = {
        "drift_score": [{"labels": labels, "points": [["2026-12-01T10:00:00", 0.02], ["2026-12-01T10:01:00", 0.6]]}]
    }
    drift = {f["id"]: f for f in build_dashboard(series, [], [])}["drift"]
    (trace,) = drift["data"]
    assert trace["name"] == "magika v1 predictions:target_label" and trace["y"] == [0.02, 0.6]
    assert trace["hovertemplate"].endswith(" bits") and "Jensen-Shannon" in drift["title"]
