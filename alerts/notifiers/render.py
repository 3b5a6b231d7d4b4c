"""Wording shared by the chat notifiers: headline, ordering, colours, clipping, fitting a size limit, alert text.

`alert_text` writes one alert's block for the text-based services (Feishu, DingTalk, WeCom, Slack),
each of which only states its markup in an `AlertLines`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from alerts.notifiers.base import Alert, Notification

T = TypeVar("T")

# Per-alert caps, so that one alert always fits every service's message limit.
SUMMARY_CHARS = 300
DESCRIPTION_CHARS = 500
VALUE_CHARS = 120
COMMAND_CHARS = 500

# Colours as hex: red / orange / yellow while firing, green once resolved.
FIRING_COLOURS = {"P0": "#D0021B", "P1": "#F5A623", "P2": "#F8E71C"}
RESOLVED_COLOUR = "#2EB886"


def ordered(alerts: Sequence[Alert]) -> list[Alert]:
    """Firing before resolved, most severe first, oldest first: what to show when space runs out."""
    return sorted(alerts, key=lambda a: (a.status != "firing", a.severity.rank, a.starts_at))


def top_severity(notification: Notification) -> str:
    """The most severe severity among the notification's alerts that share its status."""
    alerts = [a for a in notification.alerts if a.status == notification.status]
    return min(alerts, key=lambda a: a.severity.rank).severity.value


def headline(notification: Notification) -> str:
    """Say status, count, severity and name in one line, e.g. `[FIRING:2] P0 HighLatency`."""
    alerts = ordered(notification.alerts)
    name = notification.group_labels.get("alertname") or alerts[0].name
    firing = sum(1 for a in alerts if a.status == "firing")
    state = f"FIRING:{firing}" if firing else "RESOLVED"
    return f"[{state}] {top_severity(notification)} {name}"


def colour(notification: Notification) -> str:
    """Green when resolved, else the colour of the most severe firing alert."""
    if notification.status == "resolved":
        return RESOLVED_COLOUR
    return FIRING_COLOURS[top_severity(notification)]


def state_word(alert: Alert) -> str:
    """Say FIRING or RESOLVED."""
    return "FIRING" if alert.status == "firing" else "RESOLVED"


def utc(moment: datetime) -> datetime:
    """The same instant in UTC; a naive datetime is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def when(moment: datetime | None) -> str:
    """A timestamp people read: `2024-05-01 12:00:05 UTC`."""
    return "" if moment is None else utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


def clip(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def clip_bytes(text: str, limit: int) -> str:
    """Cut `text` to at most `limit` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: max(0, limit - 3)].decode("utf-8", "ignore") + "…"


def omitted(count: int) -> str:
    """Say how many alerts a message had no room for."""
    return f"…and {count} more alert{'' if count == 1 else 's'} not shown"


def fit(render: Callable[[int], T], total: int, fits: Callable[[T], bool], most: int) -> T:
    """Render the largest number of alerts (at most `most`) whose result still `fits`."""
    shown = min(total, most)
    result = render(shown)
    while shown > 1 and not fits(result):
        shown -= 1
        result = render(shown)
    return result


def links(alert: Alert) -> list[tuple[str, str]]:
    """Return the alert's (url, label) links that are set: its console page, its runbook, its page in the docs."""
    shown = ((alert.console_url, "Console"), (alert.runbook_url, "Runbook"), (alert.docs_url, "What it means"))
    return [(url, label) for url, label in shown if url]


def markdown_link(url: str, label: str) -> str:
    """Write one link as Markdown: `[label](url)`."""
    return f"[{label}]({url})"


def _as_is(text: str) -> str:
    return text


@dataclass(frozen=True)
class AlertLines:
    """How one chat service words an alert: a template per line, filled by `alert_text`.

    Every template may use `{mark}` (the `marks` entry for the alert's status, firing then
    resolved), `{state}`, `{severity}`, `{summary}`, `{value}`, `{since}`, `{resolved}`, `{links}`
    and `{command}`. Summary and value pass through `escape`, the command through
    `escape_command`; each link through `link`. Example (DingTalk's markdown)::

        AlertLines(
            title="{mark} **{state} · {severity}** {summary}",
            value="**Value:** {value}",
            since="**Since:** {since}",
            resolved="**Resolved:** {resolved}",
            run="> **Run:** {command}",
            separator="\\n\\n",
            marks=("🔴", "✅"),
        )
    """

    title: str
    value: str
    since: str
    resolved: str
    run: str
    links: str = "{links}"
    separator: str = "\n"
    marks: tuple[str, str] = ("", "")
    escape: Callable[[str], str] = _as_is
    escape_command: Callable[[str], str] = _as_is
    link: Callable[[str, str], str] = markdown_link
    # Slack shows "Resolved: <end> (since <start>)" in place of the since line; the others show both.
    resolved_replaces_since: bool = False


def alert_text(alert: Alert, lines: AlertLines, brief: bool = False) -> str:
    """Write one alert as a chat block: headline, value, since and resolved, links, the runbook command.

    `brief` (a group of several alerts) keeps the headline, the value and the links: a short list
    people can scan, each entry linking to the console page that has the rest.
    """
    fields = {
        "mark": lines.marks[alert.status != "firing"],
        "state": state_word(alert),
        "severity": alert.severity.value,
        "summary": lines.escape(clip(alert.summary, SUMMARY_CHARS)),
        "value": lines.escape(clip(alert.shown_value, VALUE_CHARS)),
        "since": when(alert.starts_at),
        "resolved": when(alert.ends_at),
        "links": " · ".join(lines.link(url, label) for url, label in links(alert)),
        "command": lines.escape_command(clip(alert.runbook_command, COMMAND_CHARS)),
    }
    ended = alert.status == "resolved" and alert.ends_at is not None
    templates = [lines.title, lines.value]
    if brief:
        templates += [lines.links] if fields["links"] else []
        return lines.separator.join(template.format(**fields) for template in templates)
    if not (ended and lines.resolved_replaces_since):
        templates.append(lines.since)
    if ended:
        templates.append(lines.resolved)
    if fields["links"]:
        templates.append(lines.links)
    if alert.runbook_command:
        templates.append(lines.run)
    # NOTE: str.format fills each field once; braces inside alert text are never read as fields.
    return lines.separator.join(template.format(**fields) for template in templates)
