"""Declared documents (alert rules, SLOs, runbook declarations, model manifests): the one wording of a refusal, and the pydantic base their models share.

Every refusal of a declared document reads

    <file>: [<item> ]field '<path>': <what is wrong>

e.g. `latency.yaml: rule 'high_p99' field 'condition.window': must look like 30s, 5m, 2h or 1d, not 'five'`
or `manifest.json: field 'inputs[0].shape': must be a list of positive integers, ...`. The item (a
rule, an SLO) is left out when the file holds one thing; a problem of the whole document has no field.
The path is dotted, with list positions in brackets (`steps[0].name`). What is wrong starts with a
verb (`must ...`, `is ...`) so it reads after the field's name.

It imports pydantic only, so `alerts/` and `controlplane/` both use it without importing each other.

Models derive from `Declared` (strict types, unknown fields refused by name, frozen); validators
raise `Problem` with their own words, adding a path below the field they check when the problem lies
deeper (`Problem("...", at=("shape", 0))`). `describe` turns pydantic's ValidationError into the line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


class Problem(ValueError):
    """What a validator found wrong, in its own words; `at` is the path below the value it checked."""

    def __init__(self, message: str, at: Sequence[int | str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.at = tuple(at)


def path_text(loc: Sequence[int | str]) -> str:
    """Write a location as `condition.window` or `steps[0].name`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def message(source: str, problem: str, *, item: str = "", path: Sequence[int | str] | str = ()) -> str:
    """Say what is wrong in the one wording: `<source>: [<item> ]field '<path>': <problem>`."""
    where = path if isinstance(path, str) else path_text(path)
    head = f"{source}: {item} " if item else f"{source}: "
    if where:
        return f"{head}field '{where}': {problem}"
    return f"{head.rstrip()}: {problem}" if item else f"{head}{problem}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


# pydantic's error types, said the house's way (strict models: no coercion, so a type error is a wrong type).
_KIND = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def problem(error: Mapping[str, Any]) -> tuple[tuple[int | str, ...], str]:
    """Return one pydantic error's path and what is wrong, in the house's words."""
    kind, ctx, loc = error["type"], error.get("ctx") or {}, tuple(error["loc"])
    cause = ctx.get("error")
    if isinstance(cause, Problem):
        return loc + cause.at, cause.message
    if kind in ("value_error", "assertion_error"):
        return loc, str(cause or error["msg"])
    if kind in _KIND:
        return loc, f"must be {_KIND[kind]}, not {_shown(error['input'])}"
    if kind == "missing":
        return loc, "is required"
    if kind == "extra_forbidden":
        return loc, "is not a known field"
    if kind in ("literal_error", "enum"):
        return loc, f"must be {ctx.get('expected')}, not {_shown(error['input'])}"
    if kind == "string_pattern_mismatch":
        return loc, f"must match {ctx.get('pattern')}, not {_shown(error['input'])}"
    if kind in ("too_short", "string_too_short"):
        n = ctx.get("min_length", 1)
        return loc, "must not be empty" if n == 1 else f"must have at least {n} items"
    if kind in ("too_long", "string_too_long"):
        return (
            loc,
            f"must have at most {ctx.get('max_length')} {'characters' if kind.startswith('string') else 'items'}",
        )
    for bound, word in (("gt", "above"), ("ge", "at least"), ("lt", "below"), ("le", "at most")):
        if bound in ctx:
            return loc, f"must be {word} {ctx[bound]}, not {_shown(error['input'])}"
    return loc, str(error["msg"])


def describe(exc: ValidationError, source: str, item: str = "", *, dict_word: str = "a mapping") -> str:
    """Say what is wrong with a document in the one wording: every field that failed, in declaration order.

    `dict_word` is what the document's format calls a dict ("a mapping" in YAML, "an object" in JSON).
    """
    said: dict[str, None] = {}
    for error in exc.errors(include_url=False):
        loc, text = problem(error)
        if dict_word != "a mapping":
            text = text.replace("a mapping", dict_word)
        said.setdefault(message(source, text, item=item, path=loc), None)
    lines = list(said)
    # NOTE: one line per field, the document named once: the rest repeat only their field.
    head = lines[0]
    rest = [line.removeprefix(f"{source}: ").removeprefix(f"{item} ") for line in lines[1:4]]
    more = f" (and {len(lines) - 4} more)" if len(lines) > 4 else ""
    return "; ".join([head, *rest]) + more


class Declared(BaseModel):
    """A declared document or part of one: strict types (5 is not "5", true is not 1), unknown fields named."""

    # NOTE: python-re, as the hand-written checks matched names: Python's `$` also matches before a final newline.
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", populate_by_name=True, regex_engine="python-re")
    unknown_field_hint: ClassVar[str] = ""  # said after the known fields, e.g. where free-form data goes

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.model_config.get("extra") == "forbid":
            known = sorted(info.alias or name for name, info in cls.model_fields.items())
            unknown = sorted(str(key) for key in data if key not in known)
            if unknown:
                more = f" (nor are {unknown[1:]})" if len(unknown) > 1 else ""
                hint = f" ({cls.unknown_field_hint})" if cls.unknown_field_hint else ""
                raise Problem(f"is not a known field{more}; known: {known}{hint}", at=(unknown[0],))
        return data
