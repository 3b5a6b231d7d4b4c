"""Flightdeck's receivers as an Alertmanager configuration: the same routes, groups and inhibit rule.

`alertmanager_config` writes what a real Alertmanager needs to notify exactly as Flightdeck does:
one child route per receiver under a root that sends nowhere (`continue: true`, so every receiver
whose route matches gets the alert, as in `alerts.dispatch`), the receiver's severities as the
matcher `severity=~"P0|P1"` beside its own matchers, its group_by and timings, and the one inhibit
rule of `alerts.lifecycle.mute_reason` (a firing P0 mutes P1 and P2 alerts of the same model). The
differential test (`tests/alerts/test_alertmanager_diff.py`) runs Alertmanager on it; an operator
moving to Alertmanager may start from it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from alerts.dispatch import Route
from alerts.lifecycle import Matcher

NOWHERE = "flightdeck-root"  # the root route's receiver: no integration, so nothing reaches it


def _duration(value: timedelta) -> str:
    """A duration as Alertmanager's config reads it (whole milliseconds)."""
    ms = round(value.total_seconds() * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _matcher(m: Matcher) -> str:
    value = m.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{m.label}{"=~" if m.regex else "="}"{value}"'


def alertmanager_config(routes: Iterable[Route], webhooks: Mapping[str, str]) -> dict[str, Any]:
    """Return an Alertmanager configuration (YAML-ready) with a webhook receiver per route (`webhooks`: name -> URL)."""
    routes = list(routes)
    children = []
    for route in routes:
        severity = Matcher("severity", "|".join(route.severities), regex=True)
        children.append(
            {
                "receiver": route.receiver,
                "matchers": [_matcher(m) for m in (severity, *route.matchers)],
                "group_by": list(route.group_by),
                "group_wait": _duration(route.group_wait),
                "group_interval": _duration(route.group_interval),
                "repeat_interval": _duration(route.repeat_interval),
                "continue": True,
            }
        )
    receivers = [{"name": NOWHERE}] + [
        {"name": r.receiver, "webhook_configs": [{"url": webhooks[r.receiver], "send_resolved": True}]} for r in routes
    ]
    inhibit = {
        "source_matchers": ['severity="P0"', 'model=~".+"'],
        "target_matchers": ['severity=~"P1|P2"', 'model=~".+"'],
        "equal": ["model"],
    }
    return {
        "route": {"receiver": NOWHERE, "routes": children},
        "receivers": receivers,
        "inhibit_rules": [inhibit],
    }
