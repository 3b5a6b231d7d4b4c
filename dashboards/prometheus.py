"""Prometheus rules generated from Flightdeck's alert rules and SLOs (alerts/rules/*.yaml).

    python -m dashboards.prometheus            # write dashboards/prometheus/flightdeck-rules.yml
    python -m dashboards.prometheus --check    # exit 1 when the committed file is out of date

List the file under `rule_files:` in prometheus.yml (check it with `promtool check rules`). Each
Flightdeck rule becomes one alerting rule: one group per rule file, `expr` the PromQL counterpart of
the condition over the rule's window and grouping, `for` the rule's `for`, the labels `severity` plus
the rule's own, and the summary and description turned into Go templates. A rule whose metric
Prometheus cannot see (it lives only in Flightdeck's database) is left out, and the file's header
says which and why. Where PromQL can only approximate Flightdeck's reading, the header says so too.

Counters are read as a rate over the window: that is Flightdeck's `avg` (one aggregate over the
window, never an average of per-interval ratios), and the closest PromQL has to its other
aggregations, since Prometheus does not see the 10-second intervals the history records. Gauges
honour the aggregation with the matching `*_over_time` function.
"""

from __future__ import annotations

import argparse
import re
import string
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import yaml

from alerts.catalogue import METRICS
from alerts.rules import LIVE_METRICS, Condition, Rule, duration_text, load_rules
from alerts.slo import load_slos
from dashboards import prometheus_slo
from dashboards.generated import generate
from dashboards.prometheus_slo import REQUEST_SECONDS, REQUESTS

OUTPUT = Path(__file__).with_name("prometheus") / "flightdeck-rules.yml"
RULES_DIR = Path(__file__).resolve().parents[1] / "alerts" / "rules"
EXTERNAL_URL = "https://flightdeck.example.com"  # the console's public URL (FLIGHTDECK_PUBLIC_URL)
MAX_QUEUE_SIZE = 128  # the engine's default max_queue_size: queue_fill is depth over this

BATCH_SIZE = "flightdeck_inference_batch_size"
CLIENT_ERRORS = "flightdeck_inference_client_errors_total"
TOKENS = "flightdeck_sequence_tokens_total"
QUEUE_DEPTH = "flightdeck_queue_depth"
ENGINE_READY = "flightdeck_engine_ready"
TRAFFIC_WEIGHT = "flightdeck_traffic_weight"
GPU_UTILIZATION = "flightdeck_gpu_utilization_ratio"
GPU_MEMORY_USED = "flightdeck_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "flightdeck_gpu_memory_total_bytes"

# Flightdeck grouping -> Prometheus labels (history device "gpu0" is gpu="0"). Series carry `node`: other
# groupings add up across nodes, but a device is one node's own (gpu="0" on two nodes is two GPUs).
LABELS = {"model": ("model",), "version": ("version",), "slot": ("slot",), "device": ("node", "gpu")}
_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
_OUTCOMES = {
    "error_rate": "error",
    "client_error_rate": "client_error",
    "timeout_rate": "timeout",
    "rejection_rate": "rejected",
}
_OVER_TIME = {"avg": "avg_over_time", "max": "max_over_time", "min": "min_over_time", "sum": "sum_over_time"}
_ACROSS = {"avg": "avg", "max": "max", "min": "min", "sum": "sum", "last": "max"}

# Metrics Flightdeck evaluates from its database alone: a rule over one of these is skipped.
NO_COUNTERPART = {
    "shadow_agreement": "shadow comparisons are recorded in Flightdeck's history only",
    "fragmentation": "heap fragmentation is sampled into Flightdeck's history only",
    "heap_reserved": "the heap's reserved bytes are sampled into Flightdeck's history only",
    "rss": "the serving process's resident set is sampled into Flightdeck's history only",
    "auto_rollbacks": "automatic rollbacks are audit events in Flightdeck's database",
    "notification_failures": "failed notifications live in Flightdeck's alert outbox",
    "drift_score": "drift is scored by Flightdeck's leader against each version's reference window in its history "
    "(exported as flightdeck_drift_score over FLIGHTDECK_DRIFT_WINDOW_S, which a Prometheus rule may watch)",
}


@dataclass(frozen=True)
class Skipped:
    """A Flightdeck rule with no Prometheus counterpart."""

    rule: str
    metric: str
    reason: str


@dataclass(frozen=True)
class RuleFile:
    """The translated rules: the document Prometheus loads, what was left out, what is approximate."""

    groups: list[dict]
    skipped: list[Skipped]
    notes: list[str]

    def document(self) -> dict:
        return {"groups": self.groups}


def number(value: float) -> str:
    """A threshold as PromQL reads it: 500 rather than 500.0, 0.05 as written."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def _by(by: Sequence[str], *extra: str) -> str:
    labels = [*extra, *dict.fromkeys(label for b in by for label in LABELS.get(b, (b,)))]
    return f" by ({', '.join(labels)})" if labels else ""


def _sum_rate(metric: str, selector: str, c: Condition) -> str:
    selector = f"{{{selector}}}" if selector else ""
    return f"sum{_by(c.by)} (rate({metric}{selector}[{duration_text(c.window)}]))"


def _over_time(aggregation: str, vector: str, window: timedelta, subquery: bool = False) -> str:
    """`vector` read over the window as the aggregation asks; `last` is the current value."""
    if aggregation == "last":
        return vector
    if subquery:
        return f"{_OVER_TIME[aggregation]}(({vector})[{duration_text(window)}:])"
    return f"{_OVER_TIME[aggregation]}({vector}[{duration_text(window)}])"


def _counter_note(c: Condition, rule: Rule) -> str | None:
    if c.aggregation in ("avg", "sum"):
        return None
    return (
        f"{rule.name}: the {c.aggregation} of {c.metric} over {duration_text(c.window)} is read as {c.metric} over the "
        f"whole {duration_text(c.window)} (Prometheus does not see Flightdeck's 10-second intervals)"
    )


Translation = tuple[str, str | None]  # (PromQL, a note when it only approximates Flightdeck)


def _requests(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    return f'sum{_by(c.by)} (increase({REQUESTS}{{outcome!="invalid"}}[{duration_text(c.window)}]))', _counter_note(
        c, rule
    )


def _throughput(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    # Flightdeck's throughput counts answered requests: successes, server errors and client errors.
    return _sum_rate(REQUESTS, 'outcome=~"success|error|client_error"', c), _counter_note(c, rule)


def _outcome_rate(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    whole = _sum_rate(REQUESTS, 'outcome!="invalid"', c)
    if "reason" in c.by:  # each kind of client error over every request of the label set
        rest = tuple(b for b in c.by if b != "reason")
        part = _sum_rate(CLIENT_ERRORS, "", c)
        whole = _sum_rate(REQUESTS, 'outcome!="invalid"', Condition(**{**vars(c), "by": rest}))
        on = ", ".join(label for b in rest for label in LABELS.get(b, (b,)))
        return f"{part} / on ({on}) group_left {whole}", _counter_note(c, rule)
    part = _sum_rate(REQUESTS, f'outcome="{_OUTCOMES[c.metric]}"', c)
    return f"{part} / {whole}", _counter_note(c, rule)


def _quantile(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    buckets = f"sum{_by(c.by, 'le')} (rate({REQUEST_SECONDS}_bucket[{duration_text(c.window)}]))"
    return f"histogram_quantile({_QUANTILES[c.metric]}, {buckets}) * 1000", _counter_note(c, rule)


def _mean(histogram: str, scale: str = "") -> Callable[[Rule, Condition, int], Translation]:
    def translate(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
        expr = f"{_sum_rate(f'{histogram}_sum', '', c)} / {_sum_rate(f'{histogram}_count', '', c)}{scale}"
        return expr, _counter_note(c, rule)

    return translate


def _padding_waste(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    real, padded = _sum_rate(TOKENS, 'kind="real"', c), _sum_rate(TOKENS, 'kind="padded"', c)
    return f"1 - {real} / {padded}", _counter_note(c, rule)


def _queue_max(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    # The history keeps each interval's largest queue; over a whole window (avg) that is the maximum.
    aggregation = "max" if c.aggregation == "avg" else c.aggregation
    return f"max{_by(c.by)} ({_over_time(aggregation, QUEUE_DEPTH, c.window)})", None


def _queue_fill(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    expr, note = _queue_max(rule, c, max_queue_size)
    return f"{expr} / {max_queue_size}", note


def _queue_mean(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    return f"sum{_by(c.by)} ({_over_time(c.aggregation, QUEUE_DEPTH, c.window)})", None


def _device(metric: str) -> Callable[[Rule, Condition, int], Translation]:
    def translate(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
        return f"{_ACROSS[c.aggregation]}{_by(c.by)} ({_over_time(c.aggregation, metric, c.window)})", None

    return translate


def _gpu_memory_fill(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    fill = f"{GPU_MEMORY_USED} / {GPU_MEMORY_TOTAL}"
    return f"{_ACROSS[c.aggregation]}{_by(c.by)} ({_over_time(c.aggregation, fill, c.window, subquery=True)})", None


def _engine_ready(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    # Readiness is read now, as Flightdeck does; with no process reporting at all the service is
    # down, so the missing series counts as not ready rather than silencing the alert.
    return f"min({ENGINE_READY}) or on() vector(0)", None


def _versions_live(rule: Rule, c: Condition, max_queue_size: int) -> Translation:
    # NOTE: Prometheus cannot see whether a rollout is in progress; this counts live versions always.
    note = (
        f"{rule.name}: Prometheus cannot see whether a rollout is in progress, so this also fires during a "
        f"rollout that splits traffic for longer than {duration_text(rule.for_)}"
    )
    return f"count{_by(c.by)} (max by (model, slot) ({TRAFFIC_WEIGHT}) > 0)", note


TRANSLATORS: dict[str, Callable[[Rule, Condition, int], Translation]] = {
    "requests": _requests,
    "throughput": _throughput,
    **dict.fromkeys(_OUTCOMES, _outcome_rate),
    **dict.fromkeys(_QUANTILES, _quantile),
    "latency_mean": _mean(REQUEST_SECONDS, " * 1000"),
    "queue_depth_max": _queue_max,
    "queue_depth_mean": _queue_mean,
    "batch_size_mean": _mean(BATCH_SIZE),
    "padding_waste": _padding_waste,
    "gpu_utilization": _device(GPU_UTILIZATION),
    "gpu_memory_used": _device(GPU_MEMORY_USED),
    "gpu_memory_total": _device(GPU_MEMORY_TOTAL),
    "gpu_memory_fill": _gpu_memory_fill,
    "engine_ready": _engine_ready,
    "queue_fill": _queue_fill,
    "versions_live": _versions_live,
}


def expression(rule: Rule, max_queue_size: int = MAX_QUEUE_SIZE) -> Translation | None:
    """The alert's PromQL, `(<metric>) <op> <threshold>`, and a note; None without a counterpart."""
    translate = TRANSLATORS.get(rule.condition.metric)
    if translate is None:
        return None
    expr, note = translate(rule, rule.condition, max_queue_size)
    return f"({expr}) {rule.condition.op} {number(rule.condition.threshold)}", note


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLOAT_SPEC = re.compile(r"(\.\d+)?([eEfFgG%d])$")


def _go_text(text: str) -> str:
    """Literal text for a Go template: braces travel as string actions."""
    return text.replace("{", '{{ "{" }}')


def _go_value(spec: str) -> str:
    match = _FLOAT_SPEC.search(spec)
    if not match:
        return "{{ $value }}"
    precision, kind = match.group(1) or "", match.group(2)
    if kind == "%":
        return "{{ $value | humanizePercentage }}"
    if kind == "d":
        precision, kind = ".0", "f"
    return f'{{{{ printf "%{precision}{kind}" $value }}}}'


def go_template(template: str, rule: Rule) -> str:
    """A Flightdeck summary (Python format) as a Prometheus annotation (Go template).

    `{model}` becomes `{{ $labels.model }}`, `{device}` `gpu{{ $labels.gpu }}`, `{value:.1%}`
    `{{ $value | humanizePercentage }}` and `{value:.0f}` `{{ printf "%.0f" $value }}`. The rule's own
    labels, its name and severity are written in, since Prometheus's $labels holds only the series'.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return _go_text(template)  # Flightdeck renders a malformed template as it is
    fixed = {**rule.labels, "alertname": rule.name, "severity": rule.severity.value}
    out = []
    for literal, field_name, spec, _conversion in parts:
        out.append(_go_text(literal))
        if field_name is None:
            continue
        name = re.split(r"[.\[]", field_name, maxsplit=1)[0]
        if name == "value":
            out.append(_go_value(spec or ""))
        elif name == "device":
            out.append("gpu{{ $labels.gpu }}")
        elif name in fixed and name not in rule.condition.by:
            out.append(_go_text(fixed[name]))
        elif _IDENTIFIER.match(name):
            out.append(f"{{{{ $labels.{name} }}}}")
        else:
            out.append(f'{{{{ index $labels "{name}" }}}}' if name and '"' not in name else "?")
    return "".join(out)


def _group_name(rule: Rule) -> str:
    match = re.match(r"^(.+?)\.ya?ml\[", rule.source)
    return f"flightdeck-{match.group(1) if match else 'rules'}"


def alerting_rule(rule: Rule, expr: str, external_url: str) -> dict:
    """One Prometheus alerting rule."""
    annotations = {"summary": go_template(rule.summary, rule)}
    if rule.description:
        annotations["description"] = go_template(rule.description, rule)
    if rule.runbook:
        annotations["runbook_url"] = _go_text(f"{external_url.rstrip('/')}/runbooks/{rule.runbook}")
    annotations["why"] = _go_text(rule.why)
    labels = {"severity": rule.severity.value, **{k: v for k, v in sorted(rule.labels.items()) if k != "severity"}}
    return {
        "alert": rule.name,
        "expr": expr,
        "for": duration_text(rule.for_),
        "labels": labels,
        "annotations": annotations,
    }


def translate(
    rules: Iterable[Rule], *, external_url: str = EXTERNAL_URL, max_queue_size: int = MAX_QUEUE_SIZE
) -> RuleFile:
    """Every rule with a counterpart as a Prometheus alerting rule, grouped by the file it came from."""
    groups: dict[str, list[dict]] = {}
    skipped: list[Skipped] = []
    notes: list[str] = []
    for rule in rules:
        translated = expression(rule, max_queue_size)
        if translated is None:
            reason = NO_COUNTERPART.get(rule.condition.metric, "Prometheus has no counterpart of this metric")
            skipped.append(Skipped(rule.name, rule.condition.metric, reason))
            continue
        expr, note = translated
        if note:
            notes.append(note)
        groups.setdefault(_group_name(rule), []).append(alerting_rule(rule, expr, external_url))
    return RuleFile([{"name": name, "rules": items} for name, items in groups.items()], skipped, notes)


def _header(result: RuleFile, folder: Path, external_url: str, max_queue_size: int) -> str:
    try:
        source = folder.resolve().relative_to(RULES_DIR.parents[1]).as_posix()
    except ValueError:
        source = folder.name
    lines = [
        f"Prometheus alerting rules generated from Flightdeck's alert rules ({source}/*.yaml).",
        "Do not edit: regenerate with `python -m dashboards.prometheus` (`--check` tells when it is stale).",
        "Load it from prometheus.yml's rule_files; validate it with `promtool check rules`.",
        f"runbook_url points at {external_url.rstrip('/')} (--external-url); "
        f"queue_fill is queue depth over {max_queue_size} (--max-queue-size).",
        "SLOs (their `slos:` lists) become a group each: burn rates recorded per window, then multi-window alerts.",
        "",
        "Skipped, with no Prometheus counterpart:",
        *([f"  - {s.rule} ({s.metric}): {s.reason}" for s in result.skipped] or ["  (none)"]),
        "",
        "Approximations:",
        *([f"  - {n}" for n in result.notes] or ["  (none)"]),
    ]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def render(
    metrics: Iterable[str],
    *,
    folder: Path = RULES_DIR,
    external_url: str = EXTERNAL_URL,
    max_queue_size: int = MAX_QUEUE_SIZE,
) -> str:
    """The rule file as committed: load the rules (over the history's `metrics` and the live ones), translate."""
    rules = load_rules(folder, [*metrics, *LIVE_METRICS])
    result = translate(rules, external_url=external_url, max_queue_size=max_queue_size)
    # The SLOs declared beside the rules: recorded burn rates and multi-window alerts, a group per SLO.
    slo_groups, slo_notes = prometheus_slo.groups(load_slos(folder), lambda r, e: alerting_rule(r, e, external_url))
    result = RuleFile([*result.groups, *slo_groups], result.skipped, [*result.notes, *slo_notes])
    body = yaml.safe_dump(result.document(), sort_keys=False, allow_unicode=True, width=10_000)
    return _header(result, folder, external_url, max_queue_size) + body


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rules", type=Path, default=RULES_DIR, help="folder of Flightdeck rule files")
    parser.add_argument("--external-url", default=EXTERNAL_URL, help="Flightdeck's public URL, for runbook links")
    parser.add_argument("--max-queue-size", type=int, default=MAX_QUEUE_SIZE, help="the engine's max_queue_size")


def _render_file(args: argparse.Namespace) -> str:
    return render(METRICS, folder=args.rules, external_url=args.external_url, max_queue_size=args.max_queue_size)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the rule file, or with --check report whether it is up to date."""
    return generate(
        argv,
        module="dashboards.prometheus",
        description=__doc__.splitlines()[0],
        output=OUTPUT,
        render=_render_file,
        add_arguments=_options,
    )


if __name__ == "__main__":
    sys.exit(main())
