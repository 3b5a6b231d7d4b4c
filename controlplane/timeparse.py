"""Times as people type them in queries and on the command line: 'now', '-15m', or ISO 8601.

Used by the history and audit APIs, silences and the CLIs; a bad value is an `ApiError` naming
the field, which the API answers as a 400 and the CLI prints.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import BeforeValidator, ValidationInfo, WithJsonSchema

from controlplane.errors import ApiError

_RELATIVE = re.compile(r"^-(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
TIME_SYNTAX = "'now', a relative time like -15m, -2h or -7d, or ISO 8601 (UTC when it has no offset)"


def parse_time(value: str, name: str, now: datetime) -> datetime:
    """Parse 'now', a relative '-15m' / '-2h' / '-7d', or an ISO 8601 time (UTC when no offset)."""
    if value == "now":
        return now
    match = _RELATIVE.match(value)
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ApiError(f"'{name}' must be 'now', a relative time like -1h, or ISO 8601; got {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _time_field(value: object, info: ValidationInfo) -> object:
    if isinstance(value, str):
        return parse_time(value, info.field_name or "time", datetime.now(UTC))
    return value  # already a datetime (parsed by the model with one 'now' for several fields)


TimeText = Annotated[
    datetime,
    BeforeValidator(_time_field),
    WithJsonSchema({"type": "string", "examples": ["now", "-15m", "2026-05-01T12:00:00Z"]}),
]
"""A query parameter in the time syntax above, as a UTC datetime; documented as the text people type."""
