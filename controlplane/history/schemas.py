"""The history API's query and response models (`/api/history`, `/summary`, `/metrics`).

Metric names come from the history's catalogue (`alerts.catalogue.METRICS`), so the document lists
exactly what the API answers for; times use the syntax of `timeparse.parse_time`, and a refusal
reads as it always has.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from alerts.catalogue import METRICS
from controlplane.contract import QueryArgs, Reply, Timestamp
from controlplane.errors import ApiError
from controlplane.rollout.states import Slot
from controlplane.timeparse import TIME_SYNTAX, TimeText, parse_time

Metric = Literal[tuple(METRICS)]  # type: ignore[valid-type]  # the catalogue's names, one source of truth
MAX_POINTS = 5000
DEFAULT_START, DEFAULT_END = "-1h", "now"


class TimeRange(QueryArgs):
    """A range of time, start before end; both read against one 'now'."""

    start: TimeText = Field(DEFAULT_START, description=f"from: {TIME_SYNTAX}")
    end: TimeText = Field(DEFAULT_END, description=f"to: {TIME_SYNTAX}")

    @model_validator(mode="before")
    @classmethod
    def _read_times(cls, data: Any) -> Any:
        # NOTE: one 'now' for both ends, so '?start=now&end=now' is an empty range, as it always was.
        now = datetime.now(UTC)
        values = dict(data)
        for name, default in (("start", DEFAULT_START), ("end", DEFAULT_END)):
            values[name] = parse_time(values.get(name, default), name, now)
        return values

    @model_validator(mode="after")
    def _ordered(self) -> TimeRange:
        if self.start >= self.end:
            raise ApiError(f"'start' ({self.start.isoformat()}) must be before 'end' ({self.end.isoformat()})")
        return self


class SeriesQuery(TimeRange):
    """One metric over a range, a point per step, optionally for one model, version or slot."""

    metric: Metric = Field(description="a name from GET /api/history/metrics")
    step: int = Field(60, ge=1, le=366 * 86400, description="seconds per point")  # bounded: a huge one overflowed
    model: str | None = Field(None, description="only this model")
    version: str | None = Field(None, description="only this version")
    slot: Slot | None = Field(None, description="only this slot")

    @model_validator(mode="before")
    @classmethod
    def _known_metric(cls, data: Any) -> Any:
        # NOTE: here rather than on the field, so a missing metric is answered with the list too.
        metric = data.get("metric")
        if metric not in METRICS:
            raise ApiError(f"'metric' must be one of {sorted(METRICS)}; got {metric!r}")
        return data

    @field_validator("step", mode="before")
    @classmethod
    def _whole_seconds(cls, value: object) -> object:
        if isinstance(value, str) and not (value.isascii() and value.isdigit() and int(value) >= 1):
            raise ApiError(f"'step' must be a whole number of seconds >= 1; got {value!r}")
        return value

    @model_validator(mode="after")
    def _few_enough_points(self) -> SeriesQuery:
        if (self.end - self.start).total_seconds() / self.step > MAX_POINTS:
            raise ApiError(f"range / step gives more than {MAX_POINTS} points; use a larger 'step'")
        return self


class SummaryQuery(TimeRange):
    """Key figures over a range, optionally for one model."""

    model: str | None = Field(None, description="only this model")


class Series(Reply):
    """One line of a metric: its labels (model, version, slot; or device) and a point per step."""

    labels: dict[str, str]
    points: list[tuple[Timestamp, float | None]] = Field(description="[end of step, value or null]")


class SeriesView(Reply):
    metric: Metric
    unit: str
    start: Timestamp
    end: Timestamp
    step: int
    series: list[Series]


class SummaryRow(Reply):
    """Key figures of one model version in one slot over the range; null where undefined."""

    model: str
    version: str
    slot: Slot
    requests: float | None
    throughput: float | None
    error_rate: float | None
    client_error_rate: float | None
    timeout_rate: float | None
    rejection_rate: float | None
    p50: float | None
    p99: float | None
    padding_waste: float | None


class SummaryView(Reply):
    start: Timestamp
    end: Timestamp
    rows: list[SummaryRow]


class MetricInfo(Reply):
    name: Metric
    description: str
    unit: str


class MetricCatalog(Reply):
    metrics: list[MetricInfo]
