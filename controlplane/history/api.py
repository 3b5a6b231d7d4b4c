"""The JSON history API: /api/history (series), /api/history/summary, /api/history/metrics.

Queries and answers are typed in `history.schemas`; the contract parses the query string before
the view runs (metric, times, step, labels) and checks what the view answers.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from alerts.catalogue import METRICS
from controlplane.context import current_services
from controlplane.contract import operation
from controlplane.history.schemas import MetricCatalog, SeriesQuery, SeriesView, SummaryQuery, SummaryView
from controlplane.history.service import HistoryService

bp = Blueprint("history", __name__, url_prefix="/api/history")


def _history() -> HistoryService:
    return current_services().history


@bp.get("")
@operation(query=SeriesQuery, response=SeriesView)
def series(query: SeriesQuery) -> dict[str, Any]:
    """Return the series of one metric over a range, one per model/version/slot (or device)."""
    data = _history().series(
        query.metric, query.start, query.end, query.step, model=query.model, version=query.version, slot=query.slot
    )
    return {
        "metric": query.metric,
        "unit": METRICS[query.metric][1],
        "start": query.start.isoformat(),
        "end": query.end.isoformat(),
        "step": query.step,
        "series": data,
    }


@bp.get("/summary")
@operation(query=SummaryQuery, response=SummaryView)
def summary(query: SummaryQuery) -> dict[str, Any]:
    """Return key figures per model/version/slot over a range."""
    rows = _history().summary(query.start, query.end, query.model)
    return {"start": query.start.isoformat(), "end": query.end.isoformat(), "rows": rows}


@bp.get("/metrics")
@operation(response=MetricCatalog)
def catalog() -> dict[str, Any]:
    """List the metrics the history can answer, with their meaning and unit."""
    return {"metrics": [{"name": n, "description": d, "unit": u} for n, (d, u) in sorted(METRICS.items())]}
