"""The drift API's query, body and response models (`/api/models/<m>/drift*`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from controlplane.contract import QueryArgs, Reply, RequestBody, Timestamp
from controlplane.errors import ApiError
from controlplane.history.schemas import MAX_POINTS, TimeRange
from controlplane.timeparse import TIME_SYNTAX, parse_time

_WINDOWS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class DriftQuery(QueryArgs):
    """The window to score (ending now) and, optionally, one version."""

    window: str = Field("1h", pattern=r"^[1-9][0-9]{0,4}[smhd]$", description="e.g. 15m, 1h, 1d")
    version: str | None = Field(None, description="only this version")

    @property
    def seconds(self) -> int:
        return int(self.window[:-1]) * _WINDOWS[self.window[-1]]

    @field_validator("window")
    @classmethod
    def _bounded(cls, window: str) -> str:
        if int(window[:-1]) * _WINDOWS[window[-1]] > 90 * 86400:
            raise ApiError(f"'window' must be at most 90d, not {window!r}")
        return window


class DriftSeriesQuery(TimeRange):
    """Scores over a range, a point per step, for one version."""

    version: str = Field(description="the version")
    step: int = Field(300, ge=10, le=86400, description="seconds per point")

    @model_validator(mode="after")
    def _few_points(self) -> DriftSeriesQuery:
        points = (self.end - self.start).total_seconds() / self.step
        if points > MAX_POINTS:
            raise ApiError(f"{points:.0f} points asked for; at most {MAX_POINTS}: widen 'step'")
        return self


class PinBody(RequestBody):
    """A window of what the version answered that later windows are compared with."""

    start: str = Field(description=f"from: {TIME_SYNTAX}")
    end: str = Field(description=f"to: {TIME_SYNTAX}")

    def window(self) -> tuple[datetime, datetime]:
        now = datetime.now(UTC)
        start, end = parse_time(self.start, "start", now), parse_time(self.end, "end", now)
        if start >= end:
            raise ApiError(f"'start' ({start.isoformat()}) must be before 'end' ({end.isoformat()})")
        if end - start > timedelta(days=90):
            raise ApiError("the reference window must be at most 90 days long")
        return start, end


class ReferenceView(Reply):
    """A version's reference window: pinned by someone, or by default its first day serving."""

    start: Timestamp
    end: Timestamp
    source: Literal["pinned", "first_day"]
    pinned_by: str | None = None
    pinned_at: Timestamp | None = None


class ScoreView(Reply):
    """One output's predictions or one input feature: the window against the reference."""

    kind: Literal["predictions", "input"]
    name: str = Field(description="the output, or the input feature (an input's column, or its per-sample mean)")
    score: float | None = Field(description="Jensen-Shannon divergence in bits, 0..1; null with too few samples")
    samples: int
    reference_samples: int
    p_value: float | None = Field(None, description="chi-square test that both are one distribution")
    mean: float | None = None
    std: float | None = None
    reference_mean: float | None = None
    reference_std: float | None = None


class VersionDrift(Reply):
    version: str
    reference: ReferenceView | None = Field(description="null for a version that never answered")
    scores: list[ScoreView]


class DriftView(Reply):
    """Every version of a model seen in the window (or the one asked for), scored against its reference."""

    model: str
    start: Timestamp
    end: Timestamp
    min_samples: int = Field(description="fewest samples on both sides before a score is given")
    versions: list[VersionDrift]


class DriftSeriesView(Reply):
    model: str
    version: str
    reference: ReferenceView | None
    series: list[dict[str, Any]]


class UnpinView(Reply):
    removed: bool = Field(description="whether a pinned reference was removed (the first day is used again)")
