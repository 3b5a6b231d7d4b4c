"""A property-based fuzz run of every documented operation, as an admin, from the generated OpenAPI document.

Schemathesis reads `/api/openapi.json` (OpenAPI 3.1, generated from the views' contracts) and
generates requests for each operation: valid ones (positive: the answer must be a documented
status with a body matching its documented schema) and invalid ones (negative: malformed bodies,
wrong types, out-of-range values; the answer must be a documented 4xx, never a 5xx). It calls the
in-process WSGI app: the same views, guards, limits and error handlers as gunicorn serves.

No 5xx is allowed anywhere, /v2 included: the demo models never fail on their own, so a 500 from
inference would be a bad input misjudged as a server fault (those are 400s), and a 503 would mean
a model stopped serving. The examples per operation are bounded and derandomized, so a run takes
the same requests each time.

Memory stays flat: the app runs in this process, so after the first pass (which warms every code
path: sessions, caches, ONNX Runtime arenas) the same requests are sent again and this process's
resident memory, measured after a collection and a heap trim, may grow only by a small bound. A
leak of more than about 7 KB per request (8 MiB over one pass of ~1,230) would exceed it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import Failure, FailureGroup

from controlplane.auth import Role
from serving.memory import rss_bytes, trim_heap
from tests.controlplane.conftest import token_for

pytestmark = pytest.mark.slow  # about a minute: the whole surface, then once more for the memory check

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]  # fmt: skip
EXAMPLES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 6}
MODELS = ("mlp", "textcls")  # served in the test home: random names only reach the 404 path
MEASURED_PASSES = 1  # after the warm-up pass: enough for a per-request leak to show, few enough to stay quick
RSS_GROWTH_LIMIT = 8 * 1024 * 1024  # observed: 0.3-3 MiB a pass of ~1,230 requests


def check(case: Case, mode: GenerationMode, call: Callable[[Case], Any], failures: list[str]) -> None:
    """Send one case and validate its answer; add what fails to `failures`, described."""
    response = call(case)
    try:
        case.validate_response(response, checks=CHECKS)
    except (Failure, FailureGroup) as exc:  # collected: one run reports every operation's findings
        summary = " ".join(str(exc).split())[:400]
        failures.append(f"{case.method} {case.formatted_path} [{mode.value}] -> {response.status_code}: {summary}")


def fuzz_operation(
    operation: APIOperation,
    mode: GenerationMode,
    call: Callable[[Case], Any],
    cases: list[tuple[Case, GenerationMode]],
    path: dict[str, str] | None = None,
) -> list[str]:
    """Run the bounded examples of one operation in one mode, keeping each in `cases`; return the failures found."""
    failures: list[str] = []

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path))
    @settings(max_examples=EXAMPLES[mode], deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    def fuzz(case: Case) -> None:
        cases.append((case, mode))
        check(case, mode, call, failures)

    try:
        fuzz()
    except Unsatisfiable:  # nothing to make invalid (no parameters, no body): negative mode has no case
        pass
    return failures


def fuzz_everything(
    operations: list[APIOperation], call: Callable[[Case], Any], cases: list[tuple[Case, GenerationMode]]
) -> list[str]:
    """Run every operation in both modes (/v2 once more per served model); return the failures found."""
    failures: list[str] = []
    for operation in operations:
        for mode in EXAMPLES:
            if mode is GenerationMode.NEGATIVE and nothing_to_break(operation):
                continue
            failures += fuzz_operation(operation, mode, call, cases)
            if operation.path.startswith("/v2/models/{name}"):
                for model in MODELS:
                    failures += fuzz_operation(operation, mode, call, cases, {"name": model, "version": "1"})
    return failures


def nothing_to_break(operation: APIOperation) -> bool:
    """True where negative mode can make no invalid request: no body, query, header or cookie, and only path
    parameters that are any string (in a URL every value is one). Hypothesis would spend ~1 s a mode finding
    that out (Unsatisfiable), and draws no case there."""
    return not any(
        len(list(part)) for part in (operation.body, operation.query, operation.headers, operation.cookies)
    ) and all(parameter.definition.get("schema") == {"type": "string"} for parameter in operation.path_parameters)


def settled_rss() -> int:
    """Return this process's resident bytes once garbage is collected and free heap pages are given back."""
    gc.collect()
    trim_heap()
    return rss_bytes()


def test_every_operation_survives_fuzzing_without_a_5xx_or_an_undocumented_answer(app, client) -> None:
    headers = token_for(app, "fuzz-admin", Role.ADMIN)

    sent = 0

    def call(case: Case) -> Any:
        nonlocal headers, sent
        sent += 1
        response = case.call(headers=headers)
        if response.status_code == 401 and client.get("/api/tokens", headers=headers).status_code == 401:
            # NOTE: the run revoked its own token (DELETE /api/tokens/{id} with a lucky id): take a new one.
            headers = token_for(app, f"fuzz-admin-{len(headers['Authorization'])}-{id(case)}", Role.ADMIN)
        return response

    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 50  # the whole surface: /api, /v2 and /metrics
    cases: list[tuple[Case, GenerationMode]] = []
    failures = fuzz_everything(operations, call, cases)
    assert failures == [], "\n".join(failures)
    per_pass = sent

    # NOTE: the measured passes send the same requests again rather than draw new ones: two thirds of a
    # pass's time is Hypothesis drawing cases, and the memory check needs the traffic, not new inputs.
    readings = [settled_rss()]
    for _ in range(MEASURED_PASSES):
        for case, mode in cases:
            check(case, mode, call, failures)
        assert failures == [], "\n".join(failures)
        readings.append(settled_rss())
    grown = readings[-1] - readings[0]
    steps = ", ".join(f"{(b - a) / 2**20:+.1f}" for a, b in zip(readings, readings[1:], strict=False))
    assert grown < RSS_GROWTH_LIMIT, (
        f"resident memory grew {grown / 2**20:.1f} MiB over {MEASURED_PASSES} passes of {per_pass} requests ({steps} MiB)"
    )
    assert app.extensions["flightdeck"].engine.ready()  # and the engine is still serving
