"""A runbook's declaration (what its script says about itself) and the checks on a run's arguments.

Pure: no I/O. The catalog feeds this the JSON a script prints for `--describe`; nothing in it is
trusted until `parse_declaration` has checked every field. `Runbook.argv` is the only way a run's
arguments become a command line, and only after `Runbook.validate` has accepted them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from controlplane.auth.roles import Role, parse_role
from controlplane.errors import ApiError

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # runbook, parameter and step names
RESERVED_NAMES = frozenset({"runs"})  # /api/runbooks/runs is the list of runs
RESERVED_PARAMS = frozenset({"describe", "dry_run", "from_step", "help", "h"})  # the helper's own flags
TYPES = ("str", "int", "float", "bool")
ON_FAILURE = ("stop", "continue")
RUNBOOK_KEYS = frozenset({"name", "description", "params", "role", "timeout_s", "automatic", "dangerous", "steps"})
PARAM_KEYS = frozenset({"type", "choices", "required", "default", "help", "pattern", "min", "max"})
MAX_TIMEOUT_S = 3600
MAX_STRING = 256
_INT_TEXT = re.compile(r"^[0-9]{1,18}$")
_FLOAT_TEXT = re.compile(r"^[0-9]{1,18}(\.[0-9]{1,18})?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class DeclarationError(ValueError):
    """A script's declaration is unusable; the message says which field and why."""


class BadArguments(ApiError):
    """A run's arguments do not match the runbook's declaration (400)."""

    code = "bad_arguments"


@dataclass(frozen=True)
class Param:
    """One declared parameter: its type and the values it allows."""

    name: str
    type: str
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] | None = None
    help: str = ""
    pattern: str | None = None
    min: float | None = None
    max: float | None = None

    def check(self, value: Any) -> Any:
        """Return `value` in its declared type, or raise BadArguments naming the parameter."""
        value = self._typed(value)
        # NOTE: checked for every type, first: a word starting with '-' could be read as an option.
        if self.type != "bool" and self.argument(value).startswith("-"):
            raise BadArguments(f"'{self.name}' may not start with '-'; got {value!r}")
        if isinstance(value, str):
            if len(value) > MAX_STRING or _CONTROL.search(value):
                raise BadArguments(f"'{self.name}' must be at most {MAX_STRING} printable characters")
            if self.pattern is not None and not re.fullmatch(self.pattern, value):
                raise BadArguments(f"'{self.name}' must match {self.pattern}; got {value!r}")
        if self.min is not None and value < self.min or self.max is not None and value > self.max:
            raise BadArguments(f"'{self.name}' must be between {self.min} and {self.max}; got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise BadArguments(f"'{self.name}' must be one of {list(self.choices)}; got {value!r}")
        return value

    def _typed(self, value: Any) -> Any:
        # NOTE: strings of digits are accepted for numbers because alert rules pass every parameter as text.
        if self.type == "str" and isinstance(value, str):
            return value
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if value in ("true", "false"):
                return value == "true"
        elif self.type == "int":
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18:
                return value
            if isinstance(value, str) and _INT_TEXT.match(value):
                return int(value)
        elif self.type == "float":
            if isinstance(value, str) and _FLOAT_TEXT.match(value):
                value = float(value)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                if not _FLOAT_TEXT.match(repr(float(abs(value)))):
                    raise BadArguments(f"'{self.name}' must be a plain decimal number; got {value!r}")
                return float(value)
        raise BadArguments(f"'{self.name}' must be {_A[self.type]}; got {value!r}")

    def argument(self, value: Any) -> str:
        """Return the one command-line word for a checked value (--name=value, --flag or --no-flag)."""
        flag = self.name.replace("_", "-")
        if self.type == "bool":
            return f"--{flag}" if value else f"--no-{flag}"
        return str(value) if self.type != "float" else repr(float(value))

    def word(self, value: Any) -> str:
        """Return the command-line word for a checked value."""
        flag = self.name.replace("_", "-")
        return self.argument(value) if self.type == "bool" else f"--{flag}={self.argument(value)}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "required": self.required, "help": self.help}
        for key in ("default", "pattern", "min", "max"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.choices is not None:
            data["choices"] = list(self.choices)
        return data


_A = {"str": "a string", "int": "a whole number", "float": "a number", "bool": "true or false"}


@dataclass(frozen=True)
class Step:
    name: str
    on_failure: str  # stop | continue


@dataclass(frozen=True)
class Runbook:
    """A registered runbook: its script's checked declaration."""

    name: str
    description: str
    params: tuple[Param, ...]
    role: Role
    timeout_s: int
    automatic: bool
    dangerous: bool
    steps: tuple[Step, ...]

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def step_names(self) -> list[str]:
        return [s.name for s in self.steps]

    def validate(self, params: Any) -> dict[str, Any]:
        """Return the run's arguments checked and typed, defaults filled in; raise BadArguments otherwise."""
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise BadArguments("'params' must be a JSON object")
        unknown = sorted(str(k) for k in params if self.param(str(k)) is None)
        if unknown:
            raise BadArguments(
                f"unknown parameter(s) {unknown} for runbook {self.name}; it takes {[p.name for p in self.params]}"
            )
        checked: dict[str, Any] = {}
        for param in self.params:
            if params.get(param.name) is not None:
                checked[param.name] = param.check(params[param.name])
            elif param.default is not None:
                checked[param.name] = param.default
            elif param.required:
                raise BadArguments(f"'{param.name}' is required by runbook {self.name}")
        return checked

    def check_step(self, name: Any) -> str:
        """Return `name` if it is one of this runbook's steps; raise BadArguments otherwise."""
        if name not in self.step_names():
            raise BadArguments(f"runbook {self.name} has no step {name!r}; its steps are {self.step_names()}")
        return name

    def arguments(self, checked: dict[str, Any], *, dry_run: bool = False, from_step: str | None = None) -> list[str]:
        """Return the command-line words for arguments `validate` returned (never a shell string)."""
        words = [self.param(name).word(value) for name, value in checked.items()]  # type: ignore[union-attr]
        if dry_run:
            words.append("--dry-run")
        if from_step is not None:
            words.append(f"--from-step={self.check_step(from_step)}")
        return words

    def target(self, checked: dict[str, Any]) -> str:
        """Return what a run acts on, for one run at a time per target: the model, else the whole engine."""
        return f"model:{checked['model']}" if "model" in checked else "engine"

    def to_dict(self) -> dict[str, Any]:
        """Return the declaration as the API shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "params": {p.name: p.to_dict() for p in self.params},
            "role": self.role.value,
            "timeout_s": self.timeout_s,
            "automatic": self.automatic,
            "dangerous": self.dangerous,
            "steps": [{"name": s.name, "on_failure": s.on_failure} for s in self.steps],
        }


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise DeclarationError(message)


def _parse_param(name: Any, spec: Any) -> Param:
    where = f"params.{name}"
    _need(isinstance(name, str) and bool(NAME.match(name)), f"parameter name {name!r} must match {NAME.pattern}")
    _need(name not in RESERVED_PARAMS, f"parameter name {name!r} is reserved")
    _need(isinstance(spec, dict), f"{where} must be an object")
    _need(not set(spec) - PARAM_KEYS, f"{where} has unknown keys {sorted(set(spec) - PARAM_KEYS)}")
    _need(spec.get("type") in TYPES, f"{where}.type must be one of {list(TYPES)}")
    _need(isinstance(spec.get("required", False), bool), f"{where}.required must be true or false")
    _need(isinstance(spec.get("help", ""), str), f"{where}.help must be a string")
    pattern = spec.get("pattern")
    if pattern is not None:
        _need(spec["type"] == "str" and isinstance(pattern, str), f"{where}.pattern must be a string, on a str")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise DeclarationError(f"{where}.pattern does not compile: {exc}") from None
    for key in ("min", "max"):
        bound = spec.get(key)
        if bound is not None:
            ok = spec["type"] in ("int", "float") and isinstance(bound, int | float) and not isinstance(bound, bool)
            _need(ok, f"{where}.{key} must be a number, on an int or float")
    choices = spec.get("choices")
    _need(choices is None or (isinstance(choices, list) and choices), f"{where}.choices must be a non-empty list")
    param = Param(
        name=name, type=spec["type"], required=spec.get("required", False), help=spec.get("help", ""),
        pattern=pattern, min=spec.get("min"), max=spec.get("max"),
    )  # fmt: skip
    try:
        if choices is not None:
            param = replace(param, choices=tuple(param.check(c) for c in choices))
        if spec.get("default") is not None:
            param = replace(param, default=param.check(spec["default"]))
    except BadArguments as exc:
        raise DeclarationError(f"{where}: {exc.message}") from None
    return param


def parse_declaration(data: Any, expected_name: str) -> Runbook:
    """Check a script's declaration field by field; return the Runbook or raise DeclarationError."""
    _need(isinstance(data, dict), "the declaration must be a JSON object")
    _need(not set(data) - RUNBOOK_KEYS, f"unknown keys {sorted(set(data) - RUNBOOK_KEYS)}")
    _need(not RUNBOOK_KEYS - set(data), f"missing keys {sorted(RUNBOOK_KEYS - set(data))}")
    _need(data["name"] == expected_name, f"name {data['name']!r} must be the file's name, {expected_name!r}")
    _need(expected_name not in RESERVED_NAMES, f"{expected_name!r} is reserved")
    _need(isinstance(data["description"], str) and bool(data["description"]), "description must be a string")
    role = parse_role(data["role"])
    _need(role is not None, f"role must be one of {[r.value for r in Role]}")
    timeout = data["timeout_s"]
    ok = isinstance(timeout, int) and not isinstance(timeout, bool) and 1 <= timeout <= MAX_TIMEOUT_S
    _need(ok, f"timeout_s must be a whole number of seconds from 1 to {MAX_TIMEOUT_S}")
    for key in ("automatic", "dangerous"):
        _need(isinstance(data[key], bool), f"{key} must be true or false")
    _need(isinstance(data["params"], dict), "params must be an object")
    params = tuple(_parse_param(name, spec) for name, spec in data["params"].items())
    raw_steps = data["steps"]
    _need(isinstance(raw_steps, list) and bool(raw_steps), "steps must be a non-empty list")
    steps = []
    for i, step in enumerate(raw_steps):
        ok = isinstance(step, dict) and set(step) == {"name", "on_failure"} and isinstance(step["name"], str)
        _need(ok, f"steps[{i}] must be {{'name', 'on_failure'}}")
        _need(bool(NAME.match(step["name"])), f"steps[{i}].name must match {NAME.pattern}")
        _need(step["on_failure"] in ON_FAILURE, f"steps[{i}].on_failure must be one of {list(ON_FAILURE)}")
        steps.append(Step(step["name"], step["on_failure"]))
    _need(len({s.name for s in steps}) == len(steps), "step names must be unique")
    return Runbook(
        name=expected_name, description=data["description"], params=params, role=role, timeout_s=timeout,
        automatic=data["automatic"], dangerous=data["dangerous"], steps=tuple(steps),
    )  # fmt: skip


def resume_point(runbook: Runbook, steps: list[dict[str, Any]]) -> str | None:
    """Return the step a failed run resumes at: the 'stop' step that failed, else the one it never finished."""
    status = {s.get("step"): s.get("status") for s in steps}
    for step in runbook.steps:
        if status.get(step.name) == "failed" and step.on_failure == "stop":
            return step.name
    for step in runbook.steps:
        if status.get(step.name) in (None, "failed"):
            return step.name
    return None
