"""Every runbook declares itself validly; declarations and run arguments are checked before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.errors import NotFound
from controlplane.runbooks.catalog import InvalidRunbook, RunbookCatalog
from controlplane.runbooks.declaration import BadArguments, DeclarationError, parse_declaration
from tests.runbooks.conftest import RUNBOOKS, run_script

REQUIRED = {"rollback", "drain_reload", "compact_memory", "set_batching", "shed_load", "diagnostics"}


@pytest.fixture(scope="module")
def catalog() -> RunbookCatalog:
    return RunbookCatalog(RUNBOOKS)


def test_every_runbook_declares_itself_validly(catalog: RunbookCatalog) -> None:
    usable, broken = catalog.all()
    assert broken == {}
    assert {r.name for r in usable} >= REQUIRED
    assert "_runbook" not in catalog.names() and "_engine" not in catalog.names()  # helpers are not runbooks
    for runbook in usable:
        described = json.loads(run_script(RUNBOOKS / f"{runbook.name}.py", "--describe").stdout)
        # The declaration survives the checks whole: what the API shows is what the script says.
        assert parse_declaration(described, runbook.name).to_dict() == runbook.to_dict()
        assert runbook.description and runbook.steps and runbook.timeout_s <= 600
    flags = {r.name: (r.dangerous, r.automatic, r.role.value) for r in usable}
    assert flags["drain_reload"] == (True, False, "operator")
    assert flags["rollback"] == (False, True, "operator")
    assert flags["diagnostics"] == (False, True, "viewer")  # a read-only snapshot gets a read-only token
    assert flags["check_drift"] == (False, True, "viewer")  # it reads and says; it changes nothing


def test_describe_needs_no_arguments_and_sends_nothing(fake_api) -> None:
    for script in sorted(RUNBOOKS.glob("[!_]*.py")):
        done = run_script(script, "--describe", env={"FLIGHTDECK_URL": fake_api.url, "FLIGHTDECK_TOKEN": "fd_x"})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["name"] == script.stem
    assert fake_api.seen == []


BROKEN = {
    "misnamed": 'RUNBOOK["name"] = "other"',
    "extra_key": 'RUNBOOK["shell"] = True',
    "reserved_param": 'RUNBOOK["params"] = {"dry_run": {"type": "bool"}}',
    "bad_param_name": 'RUNBOOK["params"] = {"Model": {"type": "str"}}',
    "bad_type": 'RUNBOOK["params"] = {"n": {"type": "list"}}',
    "bad_default": 'RUNBOOK["params"] = {"n": {"type": "int", "default": "-1"}}',
    "no_timeout": 'RUNBOOK["timeout_s"] = 0',
    "bad_role": 'RUNBOOK["role"] = "root"',
    "bad_on_failure": 'RUNBOOK["steps"] = [{"name": "go", "on_failure": "retry"}]',
    "crashes": "raise SystemExit(3)",
}
TEMPLATE = """
import sys
from _runbook import main
RUNBOOK = {{"name": "{name}", "description": "d", "params": {{}}, "role": "operator", "timeout_s": 5,
           "automatic": False, "dangerous": False, "steps": [{{"name": "go", "on_failure": "stop"}}]}}
{change}
if __name__ == "__main__":
    sys.exit(main(RUNBOOK, {{"go": lambda ctx: "went"}}))
"""


def test_unusable_declarations_are_not_registered(tmp_path: Path) -> None:
    (tmp_path / "_runbook.py").write_bytes((RUNBOOKS / "_runbook.py").read_bytes())
    for name, change in BROKEN.items():
        (tmp_path / f"{name}.py").write_text(TEMPLATE.format(name=name, change=change))
    (tmp_path / "fine.py").write_text(TEMPLATE.format(name="fine", change=""))
    (tmp_path / "prints_text.py").write_text("print('hello')")
    (tmp_path / "Not-A-Name.py").write_text(TEMPLATE.format(name="x", change=""))
    catalog = RunbookCatalog(tmp_path)
    usable, broken = catalog.all()
    assert [r.name for r in usable] == ["fine"]
    assert sorted(broken) == sorted([*BROKEN, "prints_text"])  # Not-A-Name.py is not even a candidate
    assert "misnamed.py: field 'name': must be the file's name" in broken["misnamed"]
    assert "extra_key.py: field 'shell': is not a known field" in broken["extra_key"]
    assert "reserved_param.py: field 'params.dry_run': is reserved" in broken["reserved_param"]
    assert "bad_param_name.py: field 'params.Model': is not a parameter name" in broken["bad_param_name"]
    assert "bad_type.py: field 'params.n.type': must be 'str', 'int', 'float' or 'bool'" in broken["bad_type"]
    assert "bad_default.py: field 'params.n.default': must be a whole number" in broken["bad_default"]
    assert "no_timeout.py: field 'timeout_s': must be a whole number of seconds from 1" in broken["no_timeout"]
    assert "bad_role.py: field 'role': must be one of" in broken["bad_role"]
    assert "bad_on_failure.py: field 'steps[0].on_failure': must be 'stop' or 'continue'" in broken["bad_on_failure"]
    assert "crashes.py: --describe exited with 3" in broken["crashes"]
    with pytest.raises(InvalidRunbook):
        catalog.get("extra_key")
    for name in ("Not-A-Name", "../runbooks/fine", "missing", "_runbook"):
        with pytest.raises(NotFound):
            catalog.get(name)


def test_arguments_are_checked_against_the_declaration(catalog: RunbookCatalog) -> None:
    batching, rollback, reload = catalog.get("set_batching"), catalog.get("rollback"), catalog.get("drain_reload")
    good = {"max_batch_size": 8, "max_queue_delay_ms": 1.5}
    assert batching.validate(good) == good
    # Alert rules pass every parameter as text; canonical decimal text is accepted and typed.
    assert batching.validate({"max_batch_size": "8", "max_queue_delay_ms": "2"}) == {
        "max_batch_size": 8,
        "max_queue_delay_ms": 2.0,
    }
    refused = [
        (batching, {**good, "max_batch_size": "eight"}, "must be a whole number"),
        (batching, {**good, "max_batch_size": True}, "must be a whole number"),
        (batching, {**good, "max_batch_size": 1.5}, "must be a whole number"),
        (batching, {**good, "max_batch_size": [8]}, "must be a whole number"),
        (batching, {**good, "max_queue_delay_ms": float("nan")}, "must be a number"),
        (batching, {**good, "max_batch_size": 0}, "between 1 and 1024"),
        (batching, {**good, "max_batch_size": -8}, "may not start with '-'"),
        (batching, {**good, "max_queue_delay_ms": "-1"}, "must be a number"),
        (batching, {"max_batch_size": 8}, "'max_queue_delay_ms' is required"),
        (batching, {**good, "shell": "sh"}, "unknown parameter(s) ['shell']"),
        (batching, ["max_batch_size", 8], "must be a JSON object"),
        (rollback, {"model": "-rf"}, "may not start with '-'"),
        (rollback, {"model": "--from-step=verify"}, "may not start with '-'"),
        (rollback, {"model": "textcls; rm -rf /"}, "must match"),
        (rollback, {"model": "$(touch /tmp/owned)"}, "must match"),
        (rollback, {"model": "../../etc"}, "must match"),
        (rollback, {"model": "text\ncls"}, "printable"),
        (rollback, {"model": 7}, "must be a string"),
        (reload, {"model": "textcls", "slot": "purple"}, "must be one of ['blue', 'green']"),
    ]
    for runbook, params, message in refused:
        with pytest.raises(BadArguments) as refusal:
            runbook.validate(params)
        assert message in refusal.value.message, (params, refusal.value.message)
        assert refusal.value.status == 400


def test_checked_arguments_become_one_word_each(catalog: RunbookCatalog) -> None:
    batching = catalog.get("set_batching")
    checked = batching.validate({"max_batch_size": 8, "max_queue_delay_ms": 1.5})
    assert batching.arguments(checked) == ["--max-batch-size=8", "--max-queue-delay-ms=1.5"]
    assert batching.arguments(checked, dry_run=True, from_step="confirm")[-2:] == ["--dry-run", "--from-step=confirm"]
    with pytest.raises(BadArguments, match="has no step"):
        batching.arguments(checked, from_step="confirm; reboot")
    assert catalog.command(batching, [])[1:] == [str(RUNBOOKS / "set_batching.py")]
    assert batching.target(checked) == "engine"
    rollback = catalog.get("rollback")
    assert rollback.target(rollback.validate({"model": "textcls"})) == "model:textcls"


def test_a_bad_declaration_in_json_names_the_field() -> None:
    base = {
        "name": "x", "description": "d", "params": {}, "role": "operator", "timeout_s": 5, "automatic": False,
        "dangerous": False, "steps": [{"name": "go", "on_failure": "stop"}],
    }  # fmt: skip
    cases = [
        ({**base, "steps": []}, "x.py: field 'steps': must not be empty"),
        (
            {**base, "steps": [{"name": "go", "on_failure": "stop"}] * 2},
            "x.py: field 'steps': must name each step once; repeated: ['go']",
        ),
        ({**base, "timeout_s": True}, "x.py: field 'timeout_s': must be a whole number"),
        (
            {**base, "params": {"n": {"type": "str", "pattern": "("}}},
            "x.py: field 'params.n.pattern': does not compile",
        ),
        (
            {**base, "params": {"n": {"type": "str", "min": 1}}},
            "x.py: field 'params.n.min': must be a number, on an int or float",
        ),
        (
            {**base, "params": {"n": {"type": "str", "choices": ["a", "-b"]}}},
            "x.py: field 'params.n.choices[1]': may not start with '-'",
        ),
        (
            {**base, "params": {"n": {"type": "str", "choices": []}}},
            "x.py: field 'params.n.choices': must not be empty",
        ),
        (
            {**base, "params": {"n": {"type": "int", "required": "yes"}}},
            "x.py: field 'params.n.required': must be true or false",
        ),
        ({**base, "steps": [{"name": "go"}]}, "x.py: field 'steps[0].on_failure': is required"),
        ({k: v for k, v in base.items() if k != "role"}, "x.py: field 'role': is required"),
        ([base], "x.py: must be an object"),
    ]
    for data, message in cases:
        with pytest.raises(DeclarationError) as refused:
            parse_declaration(data, "x")
        assert str(refused.value).startswith(message), str(refused.value)
    with pytest.raises(DeclarationError, match="runs.py: field 'name': is reserved"):
        parse_declaration({**base, "name": "runs"}, "runs")
