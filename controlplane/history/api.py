"""The JSON history API: /api/history (series), /api/history/summary, /api/history/metrics."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Blueprint, Response, jsonify, request

from controlplane.context import current_services
from controlplane.errors import ApiError
from controlplane.history.query import METRICS
from controlplane.timeparse import parse_time

bp = Blueprint("history", __name__, url_prefix="/api/history")

MAX_POINTS = 5000


def parse_range(default_start: str = "-1h") -> tuple[datetime, datetime]:
    """Read and check ?start= and ?end= from the request."""
    now = datetime.now(UTC)
    start = parse_time(request.args.get("start", default_start), "start", now)
    end = parse_time(request.args.get("end", "now"), "end", now)
    if start >= end:
        raise ApiError(f"'start' ({start.isoformat()}) must be before 'end' ({end.isoformat()})")
    return start, end


def _history():
    return current_services().history


@bp.get("")
def series() -> Response:
    """Return the series of one metric over a range, one per model/version/slot (or device)."""
    metric = request.args.get("metric")
    if metric not in METRICS:
        raise ApiError(f"'metric' must be one of {sorted(METRICS)}; got {metric!r}")
    start, end = parse_range()
    raw_step = request.args.get("step", "60")
    if not raw_step.isascii() or not raw_step.isdigit() or int(raw_step) < 1:
        raise ApiError(f"'step' must be a whole number of seconds >= 1; got {raw_step!r}")
    step = int(raw_step)
    if (end - start).total_seconds() / step > MAX_POINTS:
        raise ApiError(f"range / step gives more than {MAX_POINTS} points; use a larger 'step'")
    labels = {k: request.args.get(k) for k in ("model", "version", "slot")}
    data = _history().series(metric, start, end, step, **labels)
    return jsonify(
        {
            "metric": metric,
            "unit": METRICS[metric][1],
            "start": start.isoformat(),
            "end": end.isoformat(),
            "step": step,
            "series": data,
        }
    )


@bp.get("/summary")
def summary() -> Response:
    """Return key figures per model/version/slot over a range."""
    start, end = parse_range()
    rows = _history().summary(start, end, request.args.get("model"))
    return jsonify({"start": start.isoformat(), "end": end.isoformat(), "rows": rows})


@bp.get("/metrics")
def catalog() -> Response:
    """List the metrics the history can answer, with their meaning and unit."""
    return jsonify({"metrics": [{"name": n, "description": d, "unit": u} for n, (d, u) in sorted(METRICS.items())]})
