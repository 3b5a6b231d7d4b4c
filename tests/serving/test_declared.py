"""The one wording of a refused declared document, and the base model every document schema shares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError, model_validator

from serving.declared import Declared, Problem, describe, message, path_text

ROOT = Path(__file__).resolve().parents[2]


class Inner(Declared):
    window: str
    size: int = 1


class Doc(Declared):
    unknown_field_hint = "free-form data goes in 'metadata'"

    name: str
    inner: Inner
    items: list[int] = []
    flag: bool = False


def refusal(data: object, item: str = "") -> str:
    with pytest.raises(ValidationError) as caught:
        Doc.model_validate(data)
    return describe(caught.value, "x.yaml", item)


def test_the_wording_names_file_item_and_field_path() -> None:
    assert message("x.yaml", "must be a number", item="rule 'r'", path=("condition", "threshold")) == (
        "x.yaml: rule 'r' field 'condition.threshold': must be a number"
    )
    assert message("manifest.json", "is required", path=("inputs", 0, "shape")) == (
        "manifest.json: field 'inputs[0].shape': is required"
    )
    assert message("x.yaml", "not valid YAML") == "x.yaml: not valid YAML"
    assert message("x.yaml", "needs a runbook", item="rule 'r'") == "x.yaml: rule 'r': needs a runbook"
    assert path_text(("steps", 0, "name")) == "steps[0].name" and path_text((0, "x")) == "[0].x"


def test_types_are_strict_and_every_failing_field_is_named_once_with_the_document_once() -> None:
    said = refusal({"name": 5, "inner": {"window": "5m", "size": "5"}, "items": [1, True], "flag": 1}, "rule 'r'")
    assert said == (
        "x.yaml: rule 'r' field 'name': must be a string, not 5; field 'inner.size': must be a whole number, not '5'; "
        "field 'items[1]': must be a whole number, not True; field 'flag': must be true or false, not 1"
    )
    assert refusal({"name": "n"}) == "x.yaml: field 'inner': is required"
    assert refusal(["n"]) == "x.yaml: must be a mapping, not ['n']"


def test_more_than_four_problems_are_counted_not_listed() -> None:
    said = refusal({"name": 1, "inner": 2, "items": [True, True, True]})
    assert said.count("field '") == 4 and said.endswith("(and 1 more)")


def test_an_unknown_field_is_named_with_the_known_ones_and_the_hint() -> None:
    assert refusal({"name": "n", "inner": {"window": "5m"}, "nmae": 1, "zz": 2}) == (
        "x.yaml: field 'nmae': is not a known field (nor are ['zz']); known: ['flag', 'inner', 'items', 'name'] "
        "(free-form data goes in 'metadata')"
    )
    assert refusal({"name": "n", "inner": {"windw": "5m"}}).startswith(
        "x.yaml: field 'inner.windw': is not a known field; known: ['size', 'window']"
    )


def test_a_validators_problem_lands_at_the_path_below_its_field() -> None:
    class Checked(Declared):
        shape: list[int]

        @model_validator(mode="after")
        def _batch_axis(self) -> Checked:
            if self.shape and self.shape[0] != -1:
                raise Problem("must be -1 (the batch axis)", at=("shape", 0))
            return self

    with pytest.raises(ValidationError) as caught:
        Checked.model_validate({"shape": [2, 3]})
    assert describe(caught.value, "manifest.json") == "manifest.json: field 'shape[0]': must be -1 (the batch axis)"


def test_the_module_imports_pydantic_only() -> None:
    for path in [ROOT / "serving" / "declared.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module.split(".")[0] in {"__future__", "collections", "typing", "pydantic"}, path
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in {"typing", "collections"} for a in node.names), path
