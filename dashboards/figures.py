"""Plotly figures for the console, built from recorded history.

Inputs, as the history service returns them:

- a series: ``{"labels": {"model": "textcls", "version": "1", "slot": "blue"}, "points": [[iso_time, value], ...]}``
  where a value may be ``None`` (a gap); device series are labelled ``{"device": "gpu0"}`` or ``{"device": "cpu"}``.
  Times are UTC (plotly.js ignores offsets, so every time on one axis must share one zone);
- a batch-size distribution: ``{"labels": {...}, "counts": {"1": 120, "8": 40}}``;
- a marker: ``{"time": iso_time, "kind": "rollout" | "alert", "text": "..."}``, drawn on every time axis
  (its label laid out by ``dashboards.markers`` so that none overprints another).

Each figure is a plain dict ``{"id", "title", "data", "layout"}`` for ``Plotly.react`` that the standard
``json`` module can dump. Plotly renders a subset of HTML in names and annotations, so every string that
comes from data is escaped before it goes in.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dashboards.markers import ROW_PX, Decorations, marker_decorations, utc_naive

NO_DATA = "no data in this range"
# Plotly's default colour sequence; one colour per series, the same in every figure.
PALETTE = (
    "#636efa",
    "#ef553b",
    "#00cc96",
    "#ab63fa",
    "#ffa15a",
    "#19d3f3",
    "#ff6692",
    "#b6e880",
    "#ff97ff",
    "#fecb52",
)
_GIB = 1024**3
_TOP_PX = 60


@dataclass(frozen=True)
class Line:
    """One history metric drawn as a line per series."""

    metric: str
    label: str = ""  # appended to the series name, e.g. "p99"
    dash: str = "solid"
    scale: float = 1.0  # 100 for a 0..1 ratio shown as a percentage
    unit: str = ""  # shown after the value on hover
    axis: str = "y"


@dataclass(frozen=True)
class Panel:
    """One time-series figure: its id, title, y axis, and the metrics it draws."""

    id: str
    title: str
    y_title: str
    lines: tuple[Line, ...]
    percent: bool = False
    y2_title: str | None = None


_PCT = 100.0
PANELS = (
    Panel("throughput", "Throughput", "requests/s", (Line("throughput", unit=" req/s"),)),
    Panel(
        "latency",
        "Latency p50 / p90 / p99 per version",
        "ms",
        (
            Line("p50", "p50", "dot", unit=" ms"),
            Line("p90", "p90", "dash", unit=" ms"),
            Line("p99", "p99", "solid", unit=" ms"),
        ),
    ),
    Panel(
        "errors",
        "Error, timeout and rejection rates",
        "% of requests",
        (
            Line("error_rate", "errors", "solid", _PCT, "%"),
            Line("client_error_rate", "client-errors", "dashdot", _PCT, "%"),
            Line("timeout_rate", "timeouts", "dash", _PCT, "%"),
            Line("rejection_rate", "rejections", "dot", _PCT, "%"),
        ),
        percent=True,
    ),
    Panel(
        "queue",
        "Queue depth",
        "samples waiting",
        (Line("queue_depth_max", "max", "solid"), Line("queue_depth_mean", "mean", "dot")),
    ),
    Panel("batch_mean", "Mean batch size", "samples per batch", (Line("batch_size_mean"),)),
    Panel("padding", "Padding waste", "% of sequence positions", (Line("padding_waste", scale=_PCT, unit="%"),), True),
    Panel(
        "gpu",
        "GPU utilisation and memory",
        "utilisation %",
        (
            Line("gpu_utilization", "utilisation", "solid", _PCT, "%"),
            Line("gpu_memory_used", "memory", "dot", 1 / _GIB, " GiB", axis="y2"),
        ),
        percent=True,
        y2_title="memory used (GiB)",
    ),
    Panel("fragmentation", "Memory fragmentation", "%", (Line("fragmentation", scale=_PCT, unit="%"),), True),
)
# Drift scores are not a history metric: they come from `History.drift_series` (each version against its reference).
DRIFT_METRIC = "drift_score"
DRIFT_PANEL = Panel(
    "drift",
    "Drift against each version's reference (Jensen-Shannon divergence)",
    "bits (0 same, 1 no overlap)",
    (Line(DRIFT_METRIC, unit=" bits"),),
)
BATCH_ID, BATCH_TITLE = "batch", "Batch size distribution"
# Every figure build_dashboard returns, in order: (id, title).
FIGURES: tuple[tuple[str, str], ...] = (
    *((p.id, p.title) for p in PANELS[:4]),
    (BATCH_ID, BATCH_TITLE),
    *((p.id, p.title) for p in PANELS[4:]),
    (DRIFT_PANEL.id, DRIFT_PANEL.title),
)
# Every history metric the figures draw.
METRICS: tuple[str, ...] = tuple(line.metric for panel in PANELS for line in panel.lines)


def build_dashboard(
    series_by_metric: Mapping[str, Sequence[Mapping]],
    batch_distribution: Sequence[Mapping],
    markers: Sequence[Mapping],
    *,
    time_range: tuple[str, str] | None = None,
) -> list[dict]:
    """Build every console figure; `time_range` (start, end) pins the time axes to the chosen range."""
    colors = color_map(
        [*(s.get("labels") or {} for metric in METRICS for s in series_by_metric.get(metric, ()))]
        + [d.get("labels") or {} for d in batch_distribution]
    )
    span = [utc_naive(t).isoformat() for t in time_range] if time_range else None
    decorations = marker_decorations(markers, span or _data_span(series_by_metric, markers))
    figures = {p.id: time_series_figure(p, series_by_metric, colors, decorations, span) for p in PANELS}
    figures[BATCH_ID] = batch_figure(batch_distribution, colors)
    figures[DRIFT_PANEL.id] = time_series_figure(DRIFT_PANEL, series_by_metric, colors, decorations, span)
    return [figures[figure_id] for figure_id, _ in FIGURES]


def series_name(labels: Mapping[str, object]) -> str:
    """Name a series for a legend: "textcls v1 (blue)" for a slot, "gpu0" for a device, "mlp v1 input:x" (escaped)."""
    if labels.get("device"):
        return html.escape(str(labels["device"]), quote=False)
    parts = [str(labels.get("model") or "all models")]
    if labels.get("version") not in (None, ""):
        parts.append(f"v{labels['version']}")
    if labels.get("slot"):
        parts.append(f"({labels['slot']})")
    if labels.get("kind"):  # a drift series: what the score is about
        parts.append(f"{labels['kind']}:{labels.get('name', '')}")
    return html.escape(" ".join(parts), quote=False)


def color_map(labels: Iterable[Mapping[str, object]]) -> dict[str, str]:
    """Give each distinct series a colour, in name order, so a version looks the same everywhere."""
    names = sorted({series_name(lab) for lab in labels})
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def line_trace(series: Mapping, line: Line, colors: Mapping[str, str]) -> dict:
    """Turn one series into a scatter trace of `line`'s metric."""
    name = series_name(series.get("labels") or {})
    xs, ys = [], []
    for time, value in series.get("points") or ():
        xs.append(time)
        ys.append(_scaled(value, line.scale))
    return {
        "type": "scatter",
        "mode": "lines",
        "name": f"{name} {line.label}".strip(),
        "legendgroup": name,
        "x": xs,
        "y": ys,
        "yaxis": line.axis,
        "connectgaps": False,
        "line": {"color": colors.get(name, PALETTE[0]), "dash": line.dash, "width": 1.5},
        "hovertemplate": "%{y:.4~g}" + line.unit,
    }


def time_series_figure(
    panel: Panel,
    series_by_metric: Mapping[str, Sequence[Mapping]],
    colors: Mapping[str, str],
    decorations: Decorations,
    span: list[str] | None,
) -> dict:
    """Build one time-series figure, with the markers drawn on its time axis."""
    traces = [line_trace(s, line, colors) for line in panel.lines for s in series_by_metric.get(line.metric, ())]
    layout = _base_layout(panel.title, decorations.rows)
    # NOTE: automargin makes the ticks and this title push the bottom margin, so the legend's room
    # (reserved below them, see _base_layout) starts under the title whatever its height.
    layout["xaxis"] = {"type": "date", "title": {"text": "time (UTC)"}, "automargin": True}
    if span:
        layout["xaxis"]["range"] = span
    layout["yaxis"] = {"title": {"text": panel.y_title}, "rangemode": "tozero"}
    if panel.percent:
        layout["yaxis"]["ticksuffix"] = "%"
    if panel.y2_title:
        layout["yaxis2"] = {
            "title": {"text": panel.y2_title},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        }
    layout["shapes"] = list(decorations.shapes)
    layout["annotations"] = list(decorations.annotations)
    if not any(_has_values(t["y"]) for t in traces):
        traces = []
        layout["annotations"].append(_no_data_annotation())
    return {"id": panel.id, "title": panel.title, "data": traces, "layout": layout}


def batch_figure(distribution: Sequence[Mapping], colors: Mapping[str, str]) -> dict:
    """Build the batch-size histogram: one bar group per batch size, one bar per series."""
    sizes = sorted({str(k) for d in distribution for k in (d.get("counts") or {})}, key=_size_key)
    traces = []
    for item in distribution:
        counts = {str(k): v for k, v in (item.get("counts") or {}).items() if v}
        total = sum(counts.values())
        if not total:
            continue
        name = series_name(item.get("labels") or {})
        xs = [s for s in sizes if s in counts]
        traces.append(
            {
                "type": "bar",
                "name": name,
                "x": xs,
                "y": [counts[s] for s in xs],
                "customdata": [round(100 * counts[s] / total, 2) for s in xs],
                "marker": {"color": colors.get(name, PALETTE[0])},
                "hovertemplate": "batch size %{x}: %{y} batches (%{customdata}%)",
            }
        )
    layout = _base_layout(BATCH_TITLE)
    layout["barmode"] = "group"
    layout["xaxis"] = {
        "type": "category",
        "categoryorder": "array",
        "categoryarray": sizes,
        "title": {"text": "batch size (samples)"},
        "automargin": True,  # the legend's room then starts under this title (see _base_layout)
    }
    layout["yaxis"] = {"title": {"text": "batches"}, "rangemode": "tozero"}
    layout["annotations"] = [] if traces else [_no_data_annotation()]
    return {"id": BATCH_ID, "title": BATCH_TITLE, "data": traces, "layout": layout}


def _base_layout(title: str, label_rows: int = 0) -> dict:
    """Lay out the title at the top, marker label rows under it, and the legend at the very bottom."""
    return {
        "title": {
            "text": title,
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": 1,
            "yanchor": "top",
            "pad": {"t": 8},
            "font": {"size": 14},
        },
        # The title takes the top 30 px; each row of marker labels stands on the plot, one above the other.
        "margin": {"l": 60, "r": 60, "t": max(_TOP_PX, 34 + label_rows * ROW_PX), "b": 40},
        "hovermode": "x unified",
        # NOTE: container-referenced, plotly.js reserves the legend's height on top of what the axis
        # pushes (ticks and title), so the two cannot meet whatever number of rows the legend wraps to.
        # A paper-referenced legend below the plot overlapped the title once the plot shrank to fit it.
        # Past 30% of the figure's height the legend scrolls, so the plot keeps most of the room.
        "legend": {
            "orientation": "h",
            "xref": "paper",
            "x": 0,
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "maxheight": 0.3,
        },
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
    }


def _data_span(series_by_metric: Mapping[str, Sequence[Mapping]], markers: Sequence[Mapping]) -> list[str] | None:
    """Return the first and last time of any point or marker: what the time axes autorange to."""
    stamps = [p[0] for ss in series_by_metric.values() for s in ss for p in s.get("points") or () if p]
    times = []
    for stamp in [*stamps, *(m.get("time") for m in markers)]:
        try:
            times.append(utc_naive(str(stamp)))
        except ValueError:
            continue  # unreadable: plotly.js leaves it off the axis too
    return [min(times).isoformat(), max(times).isoformat()] if times else None


def _no_data_annotation() -> dict:
    return {
        "text": NO_DATA,
        "xref": "paper",
        "yref": "paper",
        "x": 0.5,
        "y": 0.5,
        "showarrow": False,
        "font": {"size": 14, "color": "#888888"},
        "name": "no-data",
    }


def _scaled(value: object, scale: float) -> float | None:
    """Return value * scale, or None for a gap (missing, not a number, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value) * scale
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _has_values(ys: Sequence[float | None]) -> bool:
    return any(y is not None for y in ys)


def _size_key(size: str) -> tuple[int, float, str]:
    try:
        return (0, float(size), size)
    except ValueError:
        return (1, 0.0, size)
