"""The documentation's reference pages, generated from the code at every build: nothing written twice.

Settings from the pydantic `Settings` (`configdoc`), the HTTP API from the OpenAPI document the server
itself serves, the CLI from click's commands, metrics from the Prometheus metric objects the product
declares and the history's catalogue, rule fields from the pydantic models that validate rule files,
and one page per shipped alert rule (SLO burn-rate rules included) and per shipped runbook.

`docsbuild/hooks.py` puts these into the MkDocs build; `tests/docs/test_site.py` checks the built pages
against the same code. Nothing in the product imports this package; the wheel does not carry it.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, get_args, get_origin

import click

ROOT = Path(__file__).resolve().parent.parent
NOTES = Path(__file__).resolve().parent / "notes"  # hand-written "what to check" per alert rule, optional


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# --- settings -------------------------------------------------------------------------------------------


def settings_markdown() -> str:
    """Return the settings table, as `flightdeck config --markdown` prints it."""
    from controlplane.config import settings_table

    return settings_table()


# --- the HTTP API ---------------------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    """Return the OpenAPI document of every registered route, built as the server builds /api/openapi.json."""
    from types import SimpleNamespace

    from flask import Flask

    from controlplane import context
    from controlplane.app import register_views
    from controlplane.config import load_settings
    from controlplane.contract import RowIdConverter
    from controlplane.openapi import build_document

    app = Flask("flightdeck-docs")
    app.url_map.converters["int"] = RowIdConverter  # NOTE: before the blueprints, as create_app does
    # NOTE: no services: the routes and their contracts are all the document reads. A blueprint's setup reads
    # the default settings (never this machine's environment) and keeps the session factory it is given.
    app.extensions[context.KEY] = SimpleNamespace(settings=load_settings(environ={}), sessions=None)
    register_views(app)
    return build_document(app)


def http_api_markdown(document: dict[str, Any] | None = None) -> str:
    """Return every operation of the OpenAPI document: method, path, who may call it, what it does."""
    document = document or openapi_document()
    groups: dict[str, list[str]] = {}
    for path, item in document["paths"].items():
        for method, op in item.items():
            tag = (op.get("tags") or [_area(path)])[0]
            role = op.get("x-required-role") or ("anyone" if op.get("security") == [] else "see security")
            groups.setdefault(tag, []).append(
                f"| `{method.upper()}` | `{_cell(path)}` | {_cell(role)} | {_cell(op.get('summary', ''))} |"
            )
    out = []
    for tag in sorted(groups):
        out += [f"## {tag}", "", "| Method | Path | Who | What |", "| --- | --- | --- | --- |", *groups[tag], ""]
    return "\n".join(out)


def _area(path: str) -> str:
    parts = [p for p in path.split("/") if p and not p.startswith("{")]
    return "/".join(parts[:2]) if parts and parts[0] == "api" else (parts[0] if parts else "/")


# --- the command line -----------------------------------------------------------------------------------


def cli_commands() -> list[tuple[str, click.Command]]:
    """Return every command of `flightdeck`, groups included, with its full name, in order."""
    from controlplane.cli import cli

    found: list[tuple[str, click.Command]] = []

    def walk(name: str, command: click.Command) -> None:
        found.append((name, command))
        if isinstance(command, click.Group):
            for sub in sorted(command.commands):
                walk(f"{name} {sub}", command.commands[sub])

    walk("flightdeck", cli)
    return found


def cli_markdown() -> str:
    """Return one section per command: its usage line, its help and its options, as `--help` prints them."""
    out = []
    for name, command in cli_commands():
        ctx = click.Context(command, info_name=name)
        usage = " ".join(command.collect_usage_pieces(ctx))
        out += [f"### `{name}`", "", f"```\n{name} {usage}\n```", ""]
        if command.help:
            out += [click.unstyle(command.help).strip(), ""]
        records = [r for p in command.get_params(ctx) if (r := p.get_help_record(ctx))]
        if records:
            out += ["| Option | |", "| --- | --- |"]
            out += [f"| `{_cell(opt)}` | {_cell(text)} |" for opt, text in records]
            out.append("")
        if isinstance(command, click.Group):
            out += ["Commands: " + ", ".join(f"`{name} {sub}`" for sub in sorted(command.commands)), ""]
    return "\n".join(out)


# --- metrics --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as exported (counters with _total)
    kind: str
    labels: tuple[str, ...]
    help: str


def prometheus_metrics() -> list[MetricDoc]:
    """Return every Prometheus metric the product declares at module level (`flightdeck_*`)."""
    from prometheus_client.metrics import MetricWrapperBase

    import controlplane.app  # noqa: F401 - imports every module that declares metrics
    import controlplane.metrics  # noqa: F401

    seen: dict[str, MetricDoc] = {}
    for module_name, module in sorted(sys.modules.items()):
        if module is None or not module_name.startswith(("controlplane", "serving", "alerts", "dashboards")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, MetricWrapperBase) and value._name.startswith("flightdeck_"):
                suffix = "_total" if value._type == "counter" else ""
                name = value._name + suffix
                seen[name] = MetricDoc(name, value._type, tuple(value._labelnames), value._documentation)
    return [seen[name] for name in sorted(seen)]


def metrics_markdown() -> str:
    """Return the Prometheus metrics table and the history's metrics (what rules and /api/history name)."""
    from alerts.catalogue import DEVICE_METRICS, SLOT_METRICS
    from alerts.rules import LIVE_METRICS

    out = [
        "## Prometheus metrics (`/metrics`)",
        "",
        "Every series also carries `node` (`FLIGHTDECK_NODE`).",
        "",
        "| Metric | Type | Labels | Meaning |",
        "| --- | --- | --- | --- |",
    ]
    for m in prometheus_metrics():
        out.append(f"| `{m.name}` | {m.kind} | {', '.join(f'`{x}`' for x in m.labels)} | {_cell(m.help)} |")
    out += [
        "",
        "## History metrics (alert rules, `/api/history`, the dashboards)",
        "",
        "Per model, version and slot:",
        "",
        "| Metric | Meaning | Unit |",
        "| --- | --- | --- |",
    ]
    out += [f"| `{name}` | {_cell(text)} | {unit} |" for name, (text, unit) in SLOT_METRICS.items()]
    out += [
        "",
        "Per device (a serving process's heap, or a GPU):",
        "",
        "| Metric | Meaning | Unit |",
        "| --- | --- | --- |",
    ]
    out += [f"| `{name}` | {_cell(text)} | {unit} |" for name, (text, unit) in DEVICE_METRICS.items()]
    out += ["", "Live state (read when rules are evaluated, not stored):", "", "| Metric | Meaning |", "| --- | --- |"]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in LIVE_METRICS.items()]
    return "\n".join(out)


# --- rule and SLO fields --------------------------------------------------------------------------------


def _type_text(annotation: Any) -> str:
    """Say what a field accepts, in the words of a rule file's author."""
    import enum
    import types
    import typing
    from datetime import timedelta

    from pydantic import BaseModel

    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return " or ".join(_type_text(a) for a in kept) + (" (may be left out)" if len(kept) < len(args) else "")
    if origin is list:
        return "list of " + _type_text(args[0])
    if origin is dict:
        return "mapping of names to text"
    if annotation is typing.Any:
        return "any"
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
        if issubclass(annotation, BaseModel):
            return "a mapping (its fields below)"
        if issubclass(annotation, timedelta):
            return "duration (30s, 5m, 2h, 1d)"
        return {"str": "text", "float": "number", "int": "integer", "bool": "true/false"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _default_text(value: Any) -> str:
    from datetime import timedelta

    from alerts.rules import duration_text

    if isinstance(value, timedelta):
        return f"`{duration_text(value)}`"
    return "empty" if value in ("", None) else f"`{value}`"


def model_fields(model: Any) -> list[tuple[str, str, str]]:
    """Return a pydantic model's fields as (name in the file, accepted type, default or 'required')."""
    rows = []
    for name, field in model.model_fields.items():
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = _default_text(field.default_factory())
        else:
            default = _default_text(field.default)
        rows.append((field.alias or name, _type_text(field.annotation), default))
    return rows


def rule_models() -> dict[str, Any]:
    """Return the pydantic models that validate rule files, by the key they sit under."""
    from alerts import rules, slo

    return {
        "rules[]": rules._Rule,
        "rules[].condition": rules._Condition,
        "rules[].automatic": rules._Automatic,
        "slos[]": slo._SLO,
    }


# What each field means, for people writing rules: the models validate, this explains. A field the
# models gain without a line here still gets its row (name, type, default), with no meaning yet.
FIELD_MEANINGS = {
    "rules[]": {
        "name": "the rule's name: the alert's `alertname`, its page in these docs",
        "severity": "P0 pages now, P1 needs someone today, P2 in working hours",
        "why": "why this severity; shown with the rule and on its page",
        "condition": "what must hold (below)",
        "for": "how long the condition must hold before the alert fires (pending until then)",
        "labels": "extra labels on every alert of the rule (receivers' matchers can route on them)",
        "summary": "the message's headline; `{model}`, `{version}`, `{value:.1%}`... from the alert's labels and value",
        "description": "a longer text under the summary, same templates",
        "runbook": "a registered runbook (`runbooks/<name>.py`) the alert links and may run",
        "runbook_params": "the runbook's arguments, templated from the alert's labels (`{model}`)",
        "automatic": "whether the alert runs the runbook by itself (below)",
    },
    "rules[].condition": {
        "metric": "a [history or live metric](metrics.md)",
        "aggregation": "how the window's values combine",
        "window": "how far back the aggregation looks",
        "op": "the comparison with `threshold`",
        "threshold": "the value the aggregate is compared with",
        "by": "one alert per distinct value of these labels (`reason` only on `client_error_rate` with `avg`)",
        "min_requests": "requests the window must hold to judge a request metric; fewer read *not enough traffic*",
        "min_reserved_mib": "`fragmentation` only: judge a process only once it holds this much memory",
    },
    "rules[].automatic": {
        "enabled": "let the alert run its runbook without a person",
        "cooldown": "the least time between two automatic runs of the runbook on one target",
        "max_attempts": "automatic runs per episode of the alert; a failed automatic run escalates a firing alert to P0",
    },
    "slos[]": {
        "name": "the SLO's name; its four burn-rate rules are named `<name>_burn_<window>`",
        "model": "the model it is about",
        "sli": "availability (no server error, timeout or queue refusal; a 400 never counts) or latency",
        "objective": "the percentage of requests that must be good, e.g. 99.9",
        "period": "the error budget's period",
        "threshold_ms": "latency SLIs: a request is good when it finished within this",
        "min_requests": "requests each window must hold (default: derived per alert from the objective)",
        "runbook": "the runbook its alerts link",
        "runbook_params": "the runbook's arguments, templated from the alert's labels",
        "description": "added to its alerts' descriptions",
    },
}


def rule_fields_markdown() -> str:
    """Return one table per part of a rule file: every field, what it accepts, its default, what it means."""
    out = []
    for where, model in rule_models().items():
        meanings = FIELD_MEANINGS.get(where, {})
        out += [f"## `{where}`", "", "| Field | Accepts | Default | Meaning |", "| --- | --- | --- | --- |"]
        out += [
            f"| `{name}` | {_cell(kind)} | {_cell(default)} | {_cell(meanings.get(name, ''))} |"
            for name, kind, default in model_fields(model)
        ]
        out.append("")
    return "\n".join(out)


# --- alert rules and runbooks ---------------------------------------------------------------------------


def shipped_rules() -> list[Any]:
    """Return every shipped alert rule: the written ones, then those the shipped SLOs generate."""
    from alerts.catalogue import METRICS
    from alerts.rules import LIVE_METRICS, load_rules
    from alerts.slo import load_slos, with_burn_rules

    folder = Path(str(files("alerts") / "rules"))  # as controlplane.services loads them
    return with_burn_rules(load_rules(folder, [*METRICS, *LIVE_METRICS]), load_slos(folder))


def shipped_runbooks() -> list[Any]:
    """Return every shipped runbook's declaration, read as the server reads it (`--describe`)."""
    from controlplane.runbooks.catalog import RunbookCatalog, runbook_directory

    usable, broken = RunbookCatalog(runbook_directory()).all()
    if broken:
        raise RuntimeError(f"shipped runbooks with unusable declarations: {broken}")
    return usable


def _doc_of_script(name: str) -> str:
    from controlplane.runbooks.catalog import runbook_directory

    tree = ast.parse((runbook_directory() / f"{name}.py").read_text())
    return ast.get_docstring(tree) or ""


def alert_page(rule: Any, runbooks: dict[str, Any]) -> str:
    """Return one alert rule's page: what it means, why this severity, what to check, the command."""
    c = rule.condition
    from alerts.rules import duration_text

    condition = f"{c.aggregation}({c.metric}) over {duration_text(c.window)} {c.op} {c.threshold:g}"
    if c.by:
        condition += " by " + ", ".join(c.by)
    out = [
        f"# {rule.name}",
        "",
        f"**{rule.severity.value}** · from `{rule.source}`",
        "",
        f"**Summary in the message:** `{rule.summary}`",
        "",
        "## What it means",
        "",
        f"Fires when `{condition}`"
        + (f" for {duration_text(rule.for_)}" if rule.for_.total_seconds() else " (at once, no `for`)")
        + ".",
        "",
    ]
    if c.min_requests:
        out += [
            f"Judged only with at least {c.min_requests} requests in the window; fewer read *not enough traffic*.",
            "",
        ]
    if c.min_reserved_mib:
        out += [f"Judged only once a process holds {c.min_reserved_mib} MiB.", ""]
    if rule.description:
        out += [rule.description, ""]
    out += ["## Why this severity", "", rule.why, ""]
    note = NOTES / "alerts" / f"{rule.name}.md"
    if note.is_file():
        out += ["## What to check", "", note.read_text().strip(), ""]
    elif getattr(rule, "slo", None) is not None:
        out += [
            "## What to check",
            "",
            "The model page shows this SLO's good/total, the error budget left and the burn rate per window "
            "(`GET /api/history/slos/" + rule.slo.name + "`). A fast burn right after a rollout: roll back. "
            "See [SLOs and error budgets](../../concepts/alerts.md#slos-and-error-budgets).",
            "",
        ]
    if rule.runbook:
        runbook = runbooks.get(rule.runbook)
        params = " ".join(f"--{k} {v.replace('{', '<').replace('}', '>')}" for k, v in rule.runbook_params.items())
        out += [
            "## The command",
            "",
            f"Runbook [`{rule.runbook}`](../../runbooks/{rule.runbook}/index.md)"
            + (f": {runbook.description}" if runbook else ""),
            "",
            "```sh",
            "export FLIGHTDECK_URL=http://127.0.0.1:8000 FLIGHTDECK_TOKEN=fd_...",
            f"python runbooks/{rule.runbook}.py {params} --dry-run".replace("  ", " "),
            f"python runbooks/{rule.runbook}.py {params}".rstrip(),
            "```",
            "",
            "The alert's page in the console (`/alerts/<fingerprint>`, the message's *Console* link) opens the "
            "runbook's form with these parameters filled in.",
            "",
        ]
        auto = rule.automatic
        if auto.enabled:
            out += [
                f"**Automatic:** the alert runs it by itself (cooldown {duration_text(auto.cooldown)}, "
                f"at most {auto.max_attempts} attempt(s)); its timeline in the console says what the run did.",
                "",
            ]
    return "\n".join(out)


def runbook_page(runbook: Any, rules: list[Any]) -> str:
    """Return one runbook's page: what it does, its parameters, its steps, how to run it, which alerts use it."""
    d = runbook.to_dict()
    required = " ".join(f"--{n} <{n}>" for n, p in d["params"].items() if p["required"])
    out = [
        f"# {runbook.name}",
        "",
        runbook.description,
        "",
        _doc_of_script(runbook.name),
        "",
        "| Role | Timeout | Automatic | Dangerous |",
        "| --- | --- | --- | --- |",
        f"| {d['role']} | {d['timeout_s']} s | {'yes' if d['automatic'] else 'no'} | "
        f"{'yes: a second operator approves a person’s run' if d['dangerous'] else 'no'} |",
        "",
        "## Parameters",
        "",
    ]
    if d["params"]:
        out += ["| Name | Type | Required | Default | Help |", "| --- | --- | --- | --- | --- |"]
        for name, p in d["params"].items():
            default = "" if p.get("default") is None else f"`{p['default']}`"
            help_text = p.get("help", "") + (
                f" (one of {', '.join(map(str, p['choices']))})" if p.get("choices") else ""
            )
            out.append(
                f"| `{name}` | {p['type']} | {'yes' if p['required'] else 'no'} | {default} | {_cell(help_text)} |"
            )
    else:
        out.append("None.")
    out += ["", "## Steps", ""]
    out += [f"{i}. `{s['name']}` (on failure: {s['on_failure']})" for i, s in enumerate(d["steps"], 1)]
    out += [
        "",
        "## Run it",
        "",
        "```sh",
        "export FLIGHTDECK_URL=http://127.0.0.1:8000 FLIGHTDECK_TOKEN=fd_...",
        f"python runbooks/{runbook.name}.py {required} --dry-run".replace("  ", " "),
        f"python runbooks/{runbook.name}.py {required}".rstrip(),
        "```",
        "",
        f"From the console: *Runbooks → {runbook.name}* (a dry run first); from the API: "
        f"`POST /api/runbooks/{runbook.name}/runs`. See [Alerts, chat and runbooks](../../concepts/alerts.md).",
        "",
    ]
    users = [r.name for r in rules if r.runbook == runbook.name]
    if users:
        out += ["## Alerts that point here", ""]
        out += [f"- [`{name}`](../../alerts/{name}/index.md)" for name in users]
        out.append("")
    return "\n".join(out)


def oncall_index(rules: list[Any], runbooks: list[Any]) -> str:
    """Return the on-call reference's index: every alert rule by severity, every runbook."""
    out = [
        "# On-call reference",
        "",
        "One page per shipped alert rule and per shipped runbook, generated from `alerts/rules/*.yaml` and "
        "`runbooks/*.py`. Every alert message links to its rule's page (*What it means*).",
        "",
        "## Alert rules",
        "",
        "| Rule | Severity | Runbook |",
        "| --- | --- | --- |",
    ]
    for rule in sorted(rules, key=lambda r: (r.severity.value, r.name)):
        runbook = f"[`{rule.runbook}`](runbooks/{rule.runbook}/index.md)" if rule.runbook else ""
        out.append(f"| [`{rule.name}`](alerts/{rule.name}/index.md) | {rule.severity.value} | {runbook} |")
    out += ["", "## Runbooks", "", "| Runbook | What it does |", "| --- | --- |"]
    out += [f"| [`{r.name}`](runbooks/{r.name}/index.md) | {_cell(r.description)} |" for r in runbooks]
    return "\n".join(out) + "\n"


def generated_pages() -> dict[str, str]:
    """Return the on-call pages, by their path under docs/: the index, one per alert rule, one per runbook."""
    rules, runbooks = shipped_rules(), shipped_runbooks()
    by_name = {r.name: r for r in runbooks}
    pages = {"oncall.md": oncall_index(rules, runbooks)}
    pages |= {f"alerts/{r.name}/index.md": alert_page(r, by_name) for r in rules}
    pages |= {f"runbooks/{r.name}/index.md": runbook_page(r, rules) for r in runbooks}
    return pages


MARKERS = {
    "<!-- generated: settings -->": settings_markdown,
    "<!-- generated: http-api -->": http_api_markdown,
    "<!-- generated: cli -->": cli_markdown,
    "<!-- generated: metrics -->": metrics_markdown,
    "<!-- generated: rule-fields -->": rule_fields_markdown,
}
