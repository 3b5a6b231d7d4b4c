"""The SLOs' burn-rate rules for Prometheus: recording rules per window, then one alert per burn window.

`dashboards.prometheus` puts these in the same rule file as the translated alert rules, one group per
SLO. As the SRE workbook ("Alerting on SLOs") suggests, each window's burn rate is recorded once:

    model:flightdeck_slo_burn_rate:rate1h{slo="mlp_availability"}
        = bad share of the model's requests over 1h / the allowed share (0.001 for 99.9%)

and each generated rule (alerts.slo.burn_rules) becomes an alert over two of them whose value is the
lower burn rate, as Flightdeck's own: `((long <= short) or short) > factor` holds exactly when both
windows burn above the factor. Availability counts server errors, timeouts and queue-full refusals
as bad (`outcome=~"error|timeout|rejected"`) out of every request that reached a slot; latency counts
the requests that ran over the threshold from the exported histogram's bucket at the threshold, so
a threshold between two bucket edges is read at the edge below it (stricter), and the header says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta

from alerts.rules import Rule, duration_text
from alerts.slo import ALERT_WINDOWS, SLI, SLO, BurnRule, burn_rules

REQUESTS = "flightdeck_inference_requests_total"
REQUEST_SECONDS = "flightdeck_inference_request_seconds"
# The exported latency histogram's bucket edges (controlplane.metrics), in seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BAD_OUTCOMES = ("error", "timeout", "rejected")
RECORD = "model:flightdeck_slo_burn_rate:rate{window}"

# A translated Flightdeck rule and its PromQL -> one Prometheus alerting rule (dashboards.prometheus).
AlertingRule = Callable[[Rule, str], dict]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(round(float(value), 12))


def bucket_edge(threshold_ms: float) -> float:
    """The exported bucket edge a latency threshold is read at: the largest at or below it (else the smallest)."""
    seconds = threshold_ms / 1000
    below = [edge for edge in LATENCY_BUCKETS if edge <= seconds + 1e-12]
    return below[-1] if below else LATENCY_BUCKETS[0]


def bad_share(slo: SLO, window: timedelta) -> str:
    """PromQL for the share of the SLO's requests that were bad over `window`."""
    w, model = duration_text(window), f'model="{slo.model}"'
    if slo.sli is SLI.AVAILABILITY:
        bad = f'sum by (model) (rate({REQUESTS}{{{model},outcome=~"{"|".join(BAD_OUTCOMES)}"}}[{w}]))'
        total = f'sum by (model) (rate({REQUESTS}{{{model},outcome!="invalid"}}[{w}]))'
        return f"{bad} / {total}"
    le = repr(bucket_edge(slo.threshold_ms or 0))  # prometheus_client writes `le` as the float's repr: 0.25, 1.0
    fast = f'sum by (model) (rate({REQUEST_SECONDS}_bucket{{{model},le="{le}"}}[{w}]))'
    ran = f"sum by (model) (rate({REQUEST_SECONDS}_count{{{model}}}[{w}]))"
    return f"1 - {fast} / {ran}"


def _enough(slo: SLO, window: timedelta, need: int) -> str:
    """` and` at least `need` requests in the window (Flightdeck's `SLO.minimum`), when that is more than one."""
    if need <= 1:
        return ""  # no request at all gives 0/0, which no comparison holds
    w, model = duration_text(window), f'model="{slo.model}"'
    counted = (
        f'{REQUESTS}{{{model},outcome!="invalid"}}'
        if slo.sli is SLI.AVAILABILITY
        else f"{REQUEST_SECONDS}_count{{{model}}}"
    )
    return f" and on (model) sum by (model) (increase({counted}[{w}])) >= {need}"


def recording_rules(slo: SLO) -> list[dict]:
    """One recording rule per window any burn alert reads: the burn rate over it, labelled with the SLO."""
    return [
        {
            "record": RECORD.format(window=duration_text(window)),
            "expr": f"({bad_share(slo, window)}) / {_number(slo.budget)}",
            "labels": {"slo": slo.name},
        }
        for window in ALERT_WINDOWS
    ]


def alert_expression(rule: BurnRule) -> str:
    """The alert's PromQL: the lower of the two windows' burn rates, above the factor, each window with enough requests."""
    assert rule.slo is not None, "a BurnRule is made by alerts.slo.burn_rules, with its SLO"
    selector = f'{{slo="{rule.slo.name}"}}'
    long = RECORD.format(window=duration_text(rule.condition.window)) + selector
    short = RECORD.format(window=duration_text(rule.short_window)) + selector
    need = rule.slo.minimum(rule.condition.threshold)
    enough = _enough(rule.slo, rule.condition.window, need) + _enough(rule.slo, rule.short_window, need)
    return f"(({long} <= {short}) or {short}) > {_number(rule.condition.threshold)}{enough}"


def notes(slos: Iterable[SLO]) -> list[str]:
    """Where Prometheus reads an SLO differently from Flightdeck."""
    result = []
    for slo in slos:
        if slo.sli is SLI.LATENCY and abs(bucket_edge(slo.threshold_ms or 0) * 1000 - (slo.threshold_ms or 0)) > 1e-9:
            edge = bucket_edge(slo.threshold_ms or 0) * 1000
            result.append(
                f"{slo.name}: {slo.threshold_ms:g} ms is not an edge of {REQUEST_SECONDS}'s buckets; Prometheus counts "
                f"requests within {edge:g} ms as good"
            )
    return result


def groups(slos: Iterable[SLO], alerting_rule: AlertingRule) -> tuple[list[dict], list[str]]:
    """One group per SLO (its recording rules, then its burn alerts), and the approximations to note."""
    slos = list(slos)
    result = []
    for slo in slos:
        alerts = [alerting_rule(rule, alert_expression(rule)) for rule in burn_rules([slo])]
        result.append({"name": f"flightdeck-slo-{slo.name}", "rules": [*recording_rules(slo), *alerts]})
    return result, notes(slos)
