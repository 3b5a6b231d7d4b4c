"""Magika's content-type classifier: INT32 byte features, batched across concurrent clients."""

from __future__ import annotations

import numpy as np
import pytest

from tests.public_models.catalogue import run_alone
from tests.public_models.conftest import Deployed, Fleet
from tests.public_models.inputs import magika_requests, magika_rows, reference
from tests.public_models.oip import assert_matches, infer_interleaved
from tests.tritonhttp import Client

pytestmark = pytest.mark.slow


def test_the_classifier_is_published_with_its_integer_input(fleet: Fleet, magika: Deployed) -> None:
    client = Client(url=fleet.url.removeprefix("http://"))
    try:
        metadata = client.get_model_metadata("magika")
    finally:
        client.close()
    assert metadata["inputs"] == [{"name": "bytes", "datatype": "INT32", "shape": [-1, 2048]}]
    assert metadata["outputs"] == [{"name": "target_label", "datatype": "FP32", "shape": [-1, 214]}]
    assert magika.pushed["golden"] == {"samples": 1, "passed": True}


def test_files_of_many_kinds_from_32_clients_match_plain_onnx_runtime(fleet: Fleet, magika: Deployed) -> None:
    requests = magika_requests(96)
    session = reference("magika")
    expected = [run_alone(session, r) for r in requests]
    answers = infer_interleaved(fleet.url, "magika", requests)
    for i, (answer, want) in enumerate(zip(answers, expected)):
        assert_matches(answer, want, f"request {i} of {len(requests[i]['bytes'])} file(s)")
    # The rows are files of different kinds: the model tells many of them apart, so the scores are not trivial.
    labels = {int(np.argmax(run_alone(session, {"bytes": row[None]})["target_label"])) for row in magika_rows()}
    assert len(labels) >= 5, labels
