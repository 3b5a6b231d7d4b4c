"""How Alertmanager, a Go program, writes things: encoding/json, time.Time, QuoteMeta, fingerprints.

Reproduced so that `alertmanager.py` can send bodies byte-identical to Alertmanager's. Go's
encoder (HTML escaping on, its default) writes struct fields in declaration order, map keys
sorted, no spaces; escapes `<`, `>`, `&`, U+2028 and U+2029 as `\\u003c`-style sequences, `\\b`
and `\\f` by name (Go 1.22+), other control characters as `\\u00XX`, and invalid UTF-8 as
`\\ufffd`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"
_QUOTE_META = set("\\.+*?()|[]{}^$")
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


class Fields(tuple):
    """A Go struct: (name, value) pairs encoded in declaration order (a dict is a Go map: sorted)."""


def go_json(value: Any) -> str:
    """Encode like Go's encoding/json with HTML escaping on (its default)."""
    if isinstance(value, Fields):
        return "{" + ",".join(f"{go_string(k)}:{go_json(v)}" for k, v in value) + "}"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{go_string(k)}:{go_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    return go_string(str(value))


def go_string(text: str) -> str:
    """Quote a string as Go's encoding/json does."""
    out = ['"']
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        elif "\ud800" <= ch <= "\udfff":  # not valid UTF-8: Go writes the replacement character
            out.append("\\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def go_time(moment: datetime | None) -> str:
    """time.Time's JSON form (RFC 3339, trailing zeros of the fraction trimmed); None is the zero time."""
    if moment is None:
        return ZERO_TIME
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    text = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    if fraction:
        text += "." + fraction
    offset = moment.utcoffset() or timedelta(0)
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def quote_meta(text: str) -> str:
    """Go's regexp.QuoteMeta, which Alertmanager applies to the receiver name."""
    return "".join("\\" + ch if ch in _QUOTE_META else ch for ch in text)


def label_fingerprint(labels: Mapping[str, str]) -> str:
    """Prometheus' LabelSet fingerprint: FNV-1a 64 over sorted name, 0xff, value, 0xff; 16 hex digits."""
    digest = 14695981039346656037
    for name in sorted(labels):
        for part in (name.encode(), b"\xff", labels[name].encode(), b"\xff"):
            for byte in part:
                digest = ((digest ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"
