"""Rollout and alert markers on a time axis: one vertical line per marker, labels that never overprint.

plotly.js draws annotations exactly where it is told, on top of each other if need be, so the labels
are laid out here, before the figure leaves the server. Each label's width is estimated from its text
and its place from its time within the figure's range on a plot assumed `PLOT_WIDTH_PX` wide. In time
order, a label goes into the first of `ROWS` rows (each raised `ROW_PX` above the last) where it clears
the label before it; a label with no free row is merged into the nearest label before it, which then
reads "3 events" and lists every marker it stands for on hover. The lines stay one per marker.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

MARKER_STYLES = {"rollout": ("#444444", "dot"), "alert": ("#d62728", "dash")}
OTHER_MARKER = ("#888888", "dot")
FONT_SIZE = 10
TEXT_CHARS = 32  # a longer label is cut with "…"; the hover text keeps it whole
# NOTE: the plot area of the narrowest chart the console draws on a laptop screen, the overview's three
# columns at its widest page (about 440 px figures less 60 px margins each side; at 1280 px wide the
# plots measure 462 on Dashboards and 475 on the overview). On a wider plot the labels only stand
# further apart; a phone's plots (about 200 px) may still let them touch, their hover text whole.
PLOT_WIDTH_PX = 320.0
CHAR_PX = 6.2  # a 10 px character, generously: marker texts in DejaVu Sans measure 5 to 5.8 px
GAP_PX = 6.0  # clear space kept between two labels in a row
ROWS = 3
ROW_PX = 14  # one 10 px line of text and its leading
MERGED_CHARS = len("99 events")  # every label reserves room for the merged text it may become


@dataclass(frozen=True)
class Marker:
    """One readable marker: its UTC time (naive, as plotly.js wants it), kind and text."""

    time: datetime
    kind: str
    text: str

    @property
    def iso(self) -> str:
        """Return the time as plotly.js reads it."""
        return self.time.isoformat()

    @property
    def hover(self) -> str:
        """Return the marker's whole line for a hover text."""
        return f"{self.kind} at {self.iso}: {self.text}"


@dataclass
class Label:
    """One label above the plot: the markers it stands for, its row, anchor and place in pixels."""

    members: list[Marker]
    row: int
    xanchor: str
    left: float
    right: float

    @property
    def text(self) -> str:
        """Return what the label reads: its one marker's text, cut to fit, or "N events"."""
        if len(self.members) > 1:
            return f"{len(self.members)} events"
        text = self.members[0].text
        return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


@dataclass(frozen=True)
class Decorations:
    """What the markers add to a time-series figure: lines, labels, and how many label rows they take."""

    shapes: list[dict]
    annotations: list[dict]
    rows: int


def read_markers(markers: Iterable[Mapping], span: Sequence[str] | None = None) -> list[Marker]:
    """Return the markers with a readable time inside `span` (start, end), sorted by time, kind and text."""
    bounds = tuple(utc_naive(t) for t in span) if span else None
    found = []
    for marker in markers:
        try:
            time = utc_naive(str(marker["time"]))
        except (KeyError, ValueError):
            continue  # a marker without a readable time has no place on the axis
        if bounds and not bounds[0] <= time <= bounds[1]:
            continue  # outside the figure's range: invisible, so it must not crowd the labels that are seen
        kind = str(marker.get("kind") or "event")
        found.append(Marker(time, kind, str(marker.get("text") or kind)))
    return sorted(found, key=lambda m: (m.time, m.kind, m.text))


def pack_labels(
    markers: Sequence[Marker], start: datetime, end: datetime, width_px: float = PLOT_WIDTH_PX
) -> list[Label]:
    """Lay labels out greedily in time order: first free row, else merged into the label before."""
    seconds = (end - start).total_seconds()
    labels: list[Label] = []
    row_right = [float("-inf")] * ROWS
    for marker in markers:
        x = width_px * (marker.time - start).total_seconds() / seconds if seconds > 0 else width_px / 2
        chars = max(min(len(marker.text), TEXT_CHARS), MERGED_CHARS)
        xanchor, left, right = _place(x, chars * CHAR_PX, width_px)
        row = next((r for r in range(ROWS) if row_right[r] + GAP_PX <= left), None)
        if row is None:
            # NOTE: the label placed last is the nearest before this one and the last of its row; its
            # reserved width already fits "N events", so merging moves nothing and frees nothing.
            labels[-1].members = [*labels[-1].members, marker]
            continue
        row_right[row] = right
        labels.append(Label([marker], row, xanchor, left, right))
    return labels


def marker_decorations(
    markers: Iterable[Mapping], span: Sequence[str] | None = None, width_px: float = PLOT_WIDTH_PX
) -> Decorations:
    """Turn rollout steps and alert firings into vertical lines and packed labels on the time axis."""
    found = read_markers(markers, span)
    if not found:
        return Decorations([], [], 0)
    start, end = (utc_naive(t) for t in span) if span else (found[0].time, found[-1].time)
    labels = pack_labels(found, start, end, width_px)
    return Decorations(
        [_line(m) for m in found],
        [_annotation(label) for label in labels],
        max(label.row for label in labels) + 1,
    )


def utc_naive(value: str) -> datetime:
    """Read an ISO time as naive UTC (naive times are taken as UTC already)."""
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.replace(tzinfo=None)


def _place(x: float, width: float, plot_width: float) -> tuple[str, float, float]:
    """Centre a label on its line, or hang it off the line's inner side near an edge of the plot."""
    if x - width / 2 < 0:
        return "left", x, x + width
    if x + width / 2 > plot_width:
        return "right", x - width, x
    return "center", x - width / 2, x + width / 2


def _style(kinds: set[str]) -> tuple[str, str]:
    return MARKER_STYLES.get(next(iter(kinds)), OTHER_MARKER) if len(kinds) == 1 else OTHER_MARKER


def _line(marker: Marker) -> dict:
    color, dash = _style({marker.kind})
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": marker.iso,
        "x1": marker.iso,
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "width": 1, "dash": dash},
        "name": marker.kind,
    }


def _annotation(label: Label) -> dict:
    kinds = {m.kind for m in label.members}
    color, _ = _style(kinds)
    return {
        "x": label.members[0].iso,
        "xref": "x",
        "y": 1,
        "yref": "paper",
        "xanchor": label.xanchor,
        "yanchor": "bottom",
        "yshift": label.row * ROW_PX,
        "showarrow": False,
        "text": html.escape(label.text, quote=False),
        "hovertext": "<br>".join(html.escape(m.hover, quote=False) for m in label.members),
        "font": {"size": FONT_SIZE, "color": color},
        "name": next(iter(kinds)) if len(kinds) == 1 else "events",
    }
