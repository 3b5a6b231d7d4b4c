"""A runbook's declaration (what its script says about itself) and the checks on a run's arguments.

Pure: no I/O. The catalog feeds this the JSON a script prints for `--describe`; nothing in it is
trusted until `parse_declaration` has checked every field. `Runbook.argv` is the only way a run's
arguments become a command line, and only after `Runbook.validate` has accepted them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from controlplane.auth.roles import Role, parse_role
from controlplane.errors import ApiError
from serving.declared import Declared, Problem, describe, message

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # runbook, parameter and step names
RESERVED_NAMES = frozenset({"runs"})  # /api/runbooks/runs is the list of runs
RESERVED_PARAMS = frozenset({"describe", "dry_run", "from_step", "help", "h"})  # the helper's own flags
ParamType = Literal["str", "int", "float", "bool"]
OnFailure = Literal["stop", "continue"]
TYPES: tuple[str, ...] = get_args(ParamType)
ON_FAILURE: tuple[str, ...] = get_args(OnFailure)
MAX_TIMEOUT_S = 3600
MAX_STRING = 256
_INT_TEXT = re.compile(r"^[0-9]{1,18}$")
_FLOAT_TEXT = re.compile(r"^[0-9]{1,18}(\.[0-9]{1,18})?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class DeclarationError(ValueError):
    """A script's declaration is unusable; the message says which field and why."""


class BadArguments(ApiError):
    """A run's arguments do not match the runbook's declaration (400); `problem` says what, without the name."""

    code = "bad_arguments"

    def __init__(self, message: str, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = message if problem is None else problem


def _refused(name: str, problem: str) -> BadArguments:
    return BadArguments(f"'{name}' {problem}", problem)


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
            raise _refused(self.name, f"may not start with '-'; got {value!r}")
        if isinstance(value, str):
            if len(value) > MAX_STRING or _CONTROL.search(value):
                raise _refused(self.name, f"must be at most {MAX_STRING} printable characters")
            if self.pattern is not None and not re.fullmatch(self.pattern, value):
                raise _refused(self.name, f"must match {self.pattern}; got {value!r}")
        if self.min is not None and value < self.min or self.max is not None and value > self.max:
            raise _refused(self.name, f"must be between {self.min} and {self.max}; got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise _refused(self.name, f"must be one of {list(self.choices)}; got {value!r}")
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
                    raise _refused(self.name, f"must be a plain decimal number; got {value!r}")
                return float(value)
        raise _refused(self.name, f"must be {_A[self.type]}; got {value!r}")

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


# --- the declaration's schema ------------------------------------------------------------------------
# Validated by the pydantic models below (serving.declared: strict types, unknown fields named), then
# turned into the frozen dataclasses above. A refusal reads `<name>.py: field 'params.n.type': ...`.

Name = Annotated[str, Field(pattern=NAME.pattern)]


class _ParamSpec(Declared):
    type: ParamType
    required: bool = False
    default: Any = None
    choices: Annotated[list[Any], Field(min_length=1)] | None = None
    help: str = ""
    pattern: str | None = None
    min: int | float | None = None
    max: int | float | None = None

    @model_validator(mode="after")
    def _fits_the_type(self) -> _ParamSpec:
        if self.pattern is not None:
            if self.type != "str":
                raise Problem("must be a string, on a str", at=("pattern",))
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise Problem(f"does not compile: {exc}", at=("pattern",)) from None
        for key in ("min", "max"):
            if getattr(self, key) is not None and self.type not in ("int", "float"):
                raise Problem("must be a number, on an int or float", at=(key,))
        return self

    def param(self, name: str) -> Param:
        """The parameter, its choices and default checked as a run's arguments would be."""
        param = Param(
            name=name, type=self.type, required=self.required, help=self.help, pattern=self.pattern,
            min=self.min, max=self.max,
        )  # fmt: skip
        if self.choices is not None:
            choices = []
            for i, choice in enumerate(self.choices):
                choices.append(_checked(param, choice, ("choices", i)))
            param = replace(param, choices=tuple(choices))
        if self.default is not None:
            param = replace(param, default=_checked(param, self.default, ("default",)))
        return param


def _checked(param: Param, value: Any, at: tuple[int | str, ...]) -> Any:
    try:
        return param.check(value)
    except BadArguments as exc:
        raise Problem(exc.problem, at=at) from None


class _Step(Declared):
    name: Name
    on_failure: OnFailure


class _Declaration(Declared):
    name: str
    description: Annotated[str, Field(min_length=1)]
    params: dict[str, _ParamSpec]
    role: Role
    timeout_s: int
    automatic: bool
    dangerous: bool
    steps: Annotated[list[_Step], Field(min_length=1)]

    @field_validator("name")
    @classmethod
    def _the_files_name(cls, name: str, info: ValidationInfo) -> str:
        expected = info.context["expected_name"]
        if name != expected:
            raise Problem(f"must be the file's name, {expected!r}, not {name!r}")
        return name

    @field_validator("params", mode="before")
    @classmethod
    def _param_names(cls, params: Any) -> Any:
        for name in params if isinstance(params, dict) else ():
            if not isinstance(name, str) or not NAME.match(name):
                raise Problem(f"is not a parameter name: it must match {NAME.pattern}", at=(str(name),))
            if name in RESERVED_PARAMS:
                raise Problem("is reserved: the runbook helper's own flag", at=(name,))
        return params

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, value: Any) -> Role:
        role = parse_role(value)
        if role is None:
            raise Problem(f"must be one of {[r.value for r in Role]}, not {value!r:.100}")
        return role

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, timeout: int) -> int:
        if not 1 <= timeout <= MAX_TIMEOUT_S:
            raise Problem(f"must be a whole number of seconds from 1 to {MAX_TIMEOUT_S}, not {timeout!r}")
        return timeout

    @field_validator("steps")
    @classmethod
    def _unique(cls, steps: list[_Step]) -> list[_Step]:
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise Problem(f"must name each step once; repeated: {sorted({n for n in names if names.count(n) > 1})}")
        return steps


def source(name: str) -> str:
    """Name the document a runbook's declaration comes from: its script's `--describe`."""
    return f"{name}.py"


def parse_declaration(data: Any, expected_name: str) -> Runbook:
    """Check a script's declaration field by field; return the Runbook or raise DeclarationError."""
    if expected_name in RESERVED_NAMES:
        raise DeclarationError(
            message(source(expected_name), "is reserved: /api/runbooks/runs lists the runs", path="name")
        )
    try:
        checked = _Declaration.model_validate(data, context={"expected_name": expected_name})
    except ValidationError as exc:
        raise DeclarationError(describe(exc, source(expected_name), dict_word="an object")) from None
    params = []
    for name, spec in checked.params.items():
        try:
            params.append(spec.param(name))
        except Problem as exc:  # a choice or default that the parameter's own checks refuse
            raise DeclarationError(
                message(source(expected_name), exc.message, path=("params", name, *exc.at))
            ) from None
    return Runbook(
        name=expected_name, description=checked.description, params=tuple(params), role=checked.role,
        timeout_s=checked.timeout_s, automatic=checked.automatic, dangerous=checked.dangerous,
        steps=tuple(Step(s.name, s.on_failure) for s in checked.steps),
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
