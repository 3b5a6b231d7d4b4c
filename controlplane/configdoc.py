"""How settings are described to people: refusals naming the variable, and the README's table.

Works on any pydantic settings class given to it, so `config.py` stays the one place they are declared.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, SecretStr, ValidationError

_PHRASES = {
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be text",
    "string_too_short": "must not be empty",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
}
_KINDS = {bool: "true/false", int: "integer", float: "number", Path: "path", SecretStr: "secret", str: "text"}


def explain(
    exc: ValidationError,
    model: type[BaseModel],
    prefix: str,
    secrets: Collection[str],
    only_in_file: Collection[str] = (),
    config_file: str | None = None,
) -> str:
    """Turn pydantic's errors into one clause per setting, each naming its environment variable."""
    unknown = sorted(str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden")
    clauses = [f"unknown setting(s) {unknown}"] if unknown else []
    for error in exc.errors():
        if error["type"] == "extra_forbidden":
            continue
        ctx: dict[str, Any] = error.get("ctx", {})
        if not error["loc"]:  # a rule across settings: its message names them
            clauses.append(str(ctx.get("error", error["msg"])))
            continue
        name = str(error["loc"][0])
        variable = prefix + name.upper() + (f" (in {config_file})" if name in only_in_file else "")
        if error["type"] == "value_error":  # our own validators phrase the rest: "is shorter than ..."
            clauses.append(f"{variable} {ctx['error']}")
            continue
        if error["type"] == "literal_error":
            phrase = f"must be one of {choices(model, name)}"
        else:
            phrase = _PHRASES.get(error["type"], error["msg"].lower()).format(**ctx)
        # NOTE: a refused secret is never echoed back: the message may end up in logs.
        shown = "" if name in secrets or error["type"] == "string_too_short" else f", not {error['input']!r}"
        clauses.append(f"{variable} {phrase}{shown}")
    return "; ".join(clauses)


def choices(model: type[BaseModel], name: str) -> str:
    """Return a Literal setting's allowed values, as the docs and the errors show them."""
    return ", ".join(model.model_fields[name].annotation.__args__)


def accepted(model: type[BaseModel], name: str) -> str:
    """Return what a setting accepts, for the docs: its type and range."""
    field = model.model_fields[name]
    if getattr(field.annotation, "__origin__", None) is Literal:
        return f"one of {choices(model, name)}"
    limits = {key: getattr(m, key) for m in field.metadata for key in ("ge", "gt", "le") if hasattr(m, key)}
    text = _KINDS.get(field.annotation, str(field.annotation))
    if "ge" in limits and "le" in limits:
        return f"{text}, {limits['ge']} to {limits['le']}"
    if "ge" in limits:
        return f"{text} ≥ {limits['ge']}"
    if "gt" in limits:
        return f"{text} > {limits['gt']}"
    return text + (", not empty" if any(hasattr(m, "min_length") for m in field.metadata) else "")


def markdown_table(model: type[BaseModel], prefix: str) -> str:
    """Return a settings class as a Markdown table: variable, default, accepted values, meaning."""
    rows = ["| Variable | Default | Values | Meaning |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        default = field.default.get_secret_value() if isinstance(field.default, SecretStr) else field.default
        rows.append(f"| `{prefix}{name.upper()}` | `{default}` | {accepted(model, name)} | {field.description} |")
    return "\n".join(rows)
