"""The console's dashboards: the page, its figures API, and plotly.js served from the installed package.

No CDN: plotly.js is the bundle that ships inside the `plotly` Python package, so the console works
on a machine with no internet. The figures come from `dashboards.figures` over the history service
(`current_services().history`, any object with the `History` methods below).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from flask import Blueprint, Response, request, send_file
from pydantic import Field, field_validator

from controlplane.console.base import login_required
from controlplane.console.base import page as console_page
from controlplane.context import current_services
from controlplane.contract import QueryArgs, Reply, operation
from controlplane.errors import ApiError, NotFound
from dashboards import figures

bp = Blueprint("dashboards", __name__)

# Each choice of time range: (how far back, seconds per point).
RANGES: dict[str, tuple[timedelta, int]] = {
    "15m": (timedelta(minutes=15), 10),
    "1h": (timedelta(hours=1), 30),
    "6h": (timedelta(hours=6), 120),
    "24h": (timedelta(hours=24), 600),
    "7d": (timedelta(days=7), 3600),
}
DEFAULT_RANGE = "1h"
REFRESH_CHOICES_S = (10, 30, 60, 300)
DEFAULT_REFRESH_S = 30
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
PLOTLY_MAX_AGE_S = 365 * 24 * 3600


class History(Protocol):
    """What the dashboards read: recorded series, batch sizes and time markers (rollouts, alerts)."""

    def series(self, metric: str, start: datetime, end: datetime, step_s: int, model: str | None) -> list[dict]:
        """Return [{"labels": {...}, "points": [[iso, value | None], ...]}, ...] for one metric."""
        ...

    def batch_distribution(self, start: datetime, end: datetime, model: str | None) -> list[dict]:
        """Return [{"labels": {...}, "counts": {"1": 120, "8": 40}}, ...]."""
        ...

    def markers(self, start: datetime, end: datetime, model: str | None) -> list[dict]:
        """Return [{"time": iso, "kind": "rollout" | "alert", "text": "..."}, ...]."""
        ...

    def drift_series(self, start: datetime, end: datetime, step_s: int, model: str | None) -> list[dict]:
        """Return drift scores as series, labels {model, version, kind, name}, each version against its reference."""
        ...


class Unavailable(ApiError):
    status = 503
    code = "unavailable"


def parse_range(value: str | None) -> str:
    """Return a valid range name (the default when absent); raise ApiError for anything else."""
    if value in (None, ""):
        return DEFAULT_RANGE
    if value not in RANGES:
        raise ApiError(f"range must be one of {', '.join(RANGES)}")
    return value


def parse_model(value: str | None) -> str | None:
    """Return a model name, or None for every model; raise ApiError for a malformed name."""
    if value in (None, ""):
        return None
    if not MODEL_NAME.fullmatch(value):
        raise ApiError("model must be a model name (letters, digits, '_', '.', '-'; at most 128 characters)")
    return value


def window(range_name: str, now: datetime | None = None) -> tuple[datetime, datetime, int]:
    """Return (start, end, step_s) for a range ending now."""
    span, step_s = RANGES[range_name]
    end = now or datetime.now(UTC)
    return end - span, end, step_s


def dashboard_figures(history: History, model: str | None, range_name: str) -> list[dict]:
    """Read what the figures need from the history and build them."""
    start, end, step_s = window(range_name)
    series = {metric: history.series(metric, start, end, step_s, model) for metric in figures.METRICS}
    series[figures.DRIFT_METRIC] = history.drift_series(start, end, step_s, model)
    return figures.build_dashboard(
        series,
        history.batch_distribution(start, end, model),
        history.markers(start, end, model),
        time_range=(start.isoformat(), end.isoformat()),
    )


def _history() -> History:
    history = getattr(current_services(), "history", None)
    if history is None:
        raise Unavailable("the history service is not running in this process")
    return history


@cache
def plotly_js_path() -> Path:
    """Find plotly.min.js inside the installed plotly package."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


@bp.get("/dashboards")
@login_required
def page() -> Response:
    """Render the dashboards page; the figures load from the API once the page is up."""
    error, status = None, 200
    try:
        range_name = parse_range(request.args.get("range"))
        model = parse_model(request.args.get("model"))
    except ApiError as exc:
        error, status = exc.message, 400
        range_name, model = DEFAULT_RANGE, None
    every = request.args.get("every", "")
    refresh_s = int(every) if every in {str(s) for s in REFRESH_CHOICES_S} else DEFAULT_REFRESH_S
    models = current_services().engine.models()
    if model and model not in models:
        models = sorted([*models, model])  # history may hold a model no longer loaded here
    return console_page(
        "dashboards.html",
        status,
        figures=figures.FIGURES,
        models=models,
        model=model or "",
        range_name=range_name,
        ranges=list(RANGES),
        refresh_choices=REFRESH_CHOICES_S,
        refresh=request.args.get("refresh") == "on",
        refresh_s=refresh_s,
        error=error,
    )


class FiguresQuery(QueryArgs):
    model: str | None = Field(None, description="Only this model (default: every model)")
    range: str = Field(DEFAULT_RANGE, json_schema_extra={"enum": list(RANGES)}, description="Time range")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: str | None) -> str | None:
        return parse_model(value)

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, value: str | None) -> str:
        return parse_range(value)


class Figures(Reply):
    model: str | None
    range: str
    figures: list[dict[str, Any]] = Field(description="Plotly figure dicts (data, layout)")


@bp.get("/api/dashboards/figures")
@operation(query=FiguresQuery, response=Figures)
def figures_api(query: FiguresQuery) -> dict[str, Any]:
    """The dashboard's Plotly figures for a model and a time range"""
    return {
        "model": query.model,
        "range": query.range,
        "figures": dashboard_figures(_history(), query.model, query.range),
    }


@bp.get("/assets/plotly.min.js")
def plotly_js() -> Response:
    """Serve the plotly.js bundle from the installed plotly package, cached for a long time."""
    path = plotly_js_path()
    if not path.is_file():
        raise NotFound("plotly.min.js is missing from the installed plotly package")
    response = send_file(path, mimetype="text/javascript", max_age=PLOTLY_MAX_AGE_S, conditional=True)
    response.cache_control.public = True
    response.cache_control.immutable = True
    return response
