"""RapidOCR's text detector (any height and width) and line direction classifier (any width), served live."""

from __future__ import annotations

import pytest

from tests.public_models.catalogue import run_alone
from tests.public_models.conftest import Deployed, Fleet
from tests.public_models.inputs import line_requests, ocr_requests, reference
from tests.public_models.oip import assert_matches, describe, infer_interleaved, infer_json, infer_triton

pytestmark = pytest.mark.slow

OUTPUT = "sigmoid_0.tmp_0"


def test_the_detector_is_published_with_both_image_sides_dynamic(fleet: Fleet, ocr_detection: Deployed) -> None:
    metadata, config = describe(fleet.url, "ocr-det")
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]
    assert metadata["outputs"] == [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, 1, -1, -1]}]
    assert config["max_batch_size"] >= 2, config  # a batchable graph: registry build says so by itself
    assert ocr_detection.manifest["inputs"][0]["shape"] == [-1, 3, -1, -1]


def test_mixed_image_sizes_from_32_clients_match_plain_onnx_runtime(fleet: Fleet, ocr_detection: Deployed) -> None:
    requests = ocr_requests(64)
    session = reference("ocr")
    expected = [run_alone(session, r) for r in requests]
    # Half through Triton's client (binary tensors), half as raw JSON, interleaved so both meet in batches.
    answers = infer_interleaved(fleet.url, "ocr-det", requests)
    for i, (answer, want, request) in enumerate(zip(answers, expected, requests)):
        assert_matches(answer, want, f"request {i} with image {list(request['x'].shape)}")
    # Outputs follow the input: a probability map as tall and wide as each image.
    assert {answer.outputs[OUTPUT].shape[2:] for answer in answers} == {r["x"].shape[2:] for r in requests}


def test_text_lines_48_to_640_wide_from_32_clients_match_plain_onnx_runtime(
    fleet: Fleet, ocr_direction: Deployed
) -> None:
    # The traffic of the report that opened issue 10: one height, many widths, every request concurrent.
    requests = line_requests(48)
    session = reference("line")
    expected = [run_alone(session, r) for r in requests]
    answers = infer_interleaved(fleet.url, "ocr-line-direction", requests, (infer_triton, infer_json))
    for i, (answer, want, request) in enumerate(zip(answers, expected, requests)):
        assert_matches(answer, want, f"request {i} with crop {list(request['x'].shape)}")
    assert len({r["x"].shape[3] for r in requests}) == 9
