"""The management API's contract: typed request and response models, checked at the edge of each view.

A view declares what it takes and what it answers with `@operation(...)`, placed under the route and
`require_role` decorators:

    @bp.post("/models/<name>/deploy")
    @require_role(Role.OPERATOR, action="rollout.start")
    @operation(body=DeployRequest, response=RolloutView, status=202, errors={404: "No such version"})
    def deploy(name: str, body: DeployRequest): ...

The body is parsed from JSON by pydantic (unknown fields refused, no type coercion) and handed to the
view as `body`; a query model's values as `query`. What the view returns (a model, or plain dicts and
lists) is validated against `response` and serialised from it, so a field the contract does not
name never leaves the server. A refusal is a 400 in the API's error envelope with a message that
names the field. The same declaration is what `openapi.py` documents, so the document cannot drift
from the code. `runtime=False` declares a route for the document only (the /v2 hot path parses its
own bodies).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from flask import Response, current_app, request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.json_schema import SkipJsonSchema
from werkzeug.routing import IntegerConverter, Map

from controlplane.errors import ApiError, UnsupportedMediaType

CONTRACT = "flightdeck_contract"  # attribute on a view: its Contract
JSON = "application/json"

View = TypeVar("View", bound=Callable[..., Any])
MAX_ROW_ID = 2**63 - 1  # the largest database id (SQLite and PostgreSQL BIGINT)


class RowIdConverter(IntegerConverter):
    """`<int:...>` in a route: an id that fits the database, so a larger one is a 404, never an overflow (a 500)."""

    def __init__(self, map: Map, fixed_digits: int = 0, min: int | None = None, max: int | None = MAX_ROW_ID) -> None:  # noqa: A002 - werkzeug's names
        super().__init__(map, fixed_digits=fixed_digits, min=min, max=max)


class RequestBody(BaseModel):
    """A JSON request body: unknown fields are refused and nothing is coerced ("5" is not 5)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class QueryArgs(BaseModel):
    """Query-string parameters: text by nature, so numbers are parsed; unknown names are ignored."""

    model_config = ConfigDict(extra="ignore")


class Reply(BaseModel):
    """A response body: every field it may carry is named, so nothing unnamed is ever sent."""

    model_config = ConfigDict(extra="forbid")


Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"}, description="ISO 8601, UTC")]
NonEmpty = Annotated[str, Field(min_length=1)]
Absent = SkipJsonSchema[None]  # `T | Absent`: a response key left out when there is no value (never sent as null)


def _absent(value: Any) -> bool:
    return value is None


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # the key is left out, not null: a null default would contradict its type


def absent_key(description: str | None = None) -> Any:
    """Declare a response key (typed `T | Absent`) that is left out when the read model has no value for it."""
    return Field(None, exclude_if=_absent, json_schema_extra=_no_default, description=description)


@dataclass(frozen=True)
class Contract:
    """What one view takes and answers with; read by the view's wrapper and by the OpenAPI generator."""

    body: Any = None
    body_media: str = JSON
    body_required: bool = True
    query: type[BaseModel] | None = None
    response: Any = None
    status: int = 200
    media: str = JSON
    errors: Mapping[int, str] = field(default_factory=dict)
    also: Mapping[int, tuple[str, Any]] = field(default_factory=dict)
    summary: str | None = None
    tags: Sequence[str] = ()
    runtime: bool = True
    path: Mapping[str, str] = field(default_factory=dict)

    def adapter(self) -> TypeAdapter[Any] | None:
        """Return the response's adapter (cached per response type), or None when the response is not JSON."""
        return _adapter(self.response) if self.response is not None and self.media == JSON else None


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def operation(
    *,
    body: Any = None,
    body_media: str = JSON,
    body_required: bool = True,
    query: type[BaseModel] | None = None,
    response: Any = None,
    status: int = 200,
    media: str = JSON,
    errors: Mapping[int, str] | None = None,
    also: Mapping[int, tuple[str, Any]] | None = None,
    summary: str | None = None,
    tags: Sequence[str] = (),
    runtime: bool = True,
    path: Mapping[str, str] | None = None,
) -> Callable[[View], View]:
    """Declare a view's contract; with `runtime`, parse its body and query and serialise its answer.

    `also` documents other success answers ({200: ("already stored", Model)}); `errors` the refusals
    beyond the ones every operation may give (400 for a bad body or query, 401/403 when guarded);
    `path` describes path parameters. A JSON body is parsed only when `body_media` is JSON; a
    multipart form is documented and left to the view.
    """
    contract = Contract(
        body=body, body_media=body_media, body_required=body_required, query=query, response=response,
        status=status, media=media, errors=dict(errors or {}), also=dict(also or {}), summary=summary,
        tags=tuple(tags), runtime=runtime, path=dict(path or {}),
    )  # fmt: skip

    def decorate(view: View) -> View:
        if not runtime:
            setattr(view, CONTRACT, contract)
            return view

        @functools.wraps(view)
        def handler(*args: Any, **kwargs: Any) -> Any:
            if body is not None and body_media == JSON:
                kwargs["body"] = parse_body(body, required=body_required)
            if query is not None:
                kwargs["query"] = parse_query(query)
            return render(contract, view(*args, **kwargs))

        setattr(handler, CONTRACT, contract)
        return handler  # type: ignore[return-value]

    return decorate


def parse_body(model: type[BaseModel], *, required: bool = True) -> Any:
    """Parse this request's JSON body into `model`; a 400 naming the field when it does not fit."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        if required:
            raise ApiError("the request body must be a JSON object")
        raw = b"{}"
    elif not is_json(request.mimetype) and not request.path.startswith("/v2/"):
        # NOTE: a cross-site form can send text/plain, urlencoded or multipart without a CORS preflight,
        # never application/json: a JSON body that must say so cannot be forged by another site (login CSRF).
        # /v2 (Triton's repository extension) takes what Triton takes: its clients may not say JSON, and its
        # writes need a bearer token or, from the console's cookie, the X-CSRF-Token header.
        raise UnsupportedMediaType(
            f"the request body must be sent with Content-Type: application/json, not {request.mimetype or 'none'!r}"
        )
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise ApiError(describe(exc, model)) from None


def is_json(mimetype: str) -> bool:
    """Whether a Content-Type (without parameters) says JSON: application/json or application/*+json."""
    return mimetype == JSON or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def parse_query(model: type[BaseModel]) -> Any:
    """Parse this request's query string into `model` (lists from repeated names)."""
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in request.args:
            continue
        many = getattr(info.annotation, "__origin__", None) in (list, tuple, set)
        values[key] = request.args.getlist(key) if many else request.args.get(key)
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ApiError(describe(exc, model)) from None


def render(contract: Contract, result: Any) -> Any:
    """Serialise a view's result through its response model; a Response passes through untouched."""
    if isinstance(result, Response):
        return result
    status: int = contract.status
    headers: Any = None
    if isinstance(result, tuple):
        result, status, *rest = result
        headers = rest[0] if rest else None
    adapter = contract.adapter()
    if adapter is None or result is None or result == "":
        return result if result is not None else "", status, headers or {}
    data = adapter.dump_python(adapter.validate_python(result), mode="json")
    response = current_app.json.response(data)
    response.status_code = status
    if headers:
        response.headers.update(headers)
    return response


# --- validation messages that read like a person wrote them ---------------------------------------


def _where(loc: Sequence[int | str]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_KIND = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


def _message(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    where = _where(error["loc"])
    if kind in _KIND:
        return f"'{where}' must be {_KIND[kind]}"
    if kind == "missing":
        return f"'{where}' is required"
    if kind in ("literal_error", "enum"):
        return f"'{where}' must be one of {ctx.get('expected')}"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return f"'{where}' must not be empty" if n == 1 else f"'{where}' must have at least {n} characters"
    if kind == "string_too_long":
        return f"'{where}' must have at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"'{where}' must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"'{where}' must have at most {ctx.get('max_length')} item(s)"
    for bound, word in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if bound in ctx and kind.startswith(("greater", "less")):
            return f"'{where}' must be {word} {ctx[bound]}"
    if kind == "string_pattern_mismatch":
        return f"'{where}' must match {ctx.get('pattern')}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error") or error["msg"])  # a validator's own words, which name the field
    return f"'{where}': {error['msg']}" if where else str(error["msg"])


def describe(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Say what is wrong with a request in one line, naming the fields (unknown ones first)."""
    errors = exc.errors(include_url=False)
    top = [e for e in errors if not e["loc"]]
    if top:
        if top[0]["type"] == "json_invalid":
            return f"the request body is not valid JSON: {top[0]['ctx']['error']}"
        if top[0]["type"] in ("value_error", "assertion_error"):  # a model_validator's rule over several fields
            return _message(top[0])
        return f"the request body must be {_KIND.get(top[0]['type'], 'a JSON object')}"
    unknown = sorted(_where(e["loc"]) for e in errors if e["type"] == "extra_forbidden")
    parts = []
    if unknown:
        fields = sorted(model.model_fields) if model is not None else []
        allowed = f"; allowed: {fields}" if fields and fields != ["root"] else ""  # a RootModel has no names to offer
        parts.append(f"unknown field(s) {unknown}{allowed}")
    parts += [_message(e) for e in errors if e["type"] != "extra_forbidden"]
    return "; ".join(dict.fromkeys(parts[:4]))
