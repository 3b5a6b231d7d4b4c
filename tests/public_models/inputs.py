"""Deterministic inputs for the public models, and golden samples computed by plain ONNX Runtime."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnxruntime as ort

from serving.golden import encode_tensor
from tests.public_models.catalogue import MAGIKA, OCR_DETECTION, OCR_DIRECTION, SILERO_VAD, reference_session, run_alone

ROOT = Path(__file__).resolve().parents[2]
Inputs = dict[str, np.ndarray]


@cache
def reference(model: str) -> ort.InferenceSession:
    """One plain ONNX Runtime session per model, shared by the tests (ORT sessions are thread-safe)."""
    return reference_session({"ocr": OCR_DETECTION, "line": OCR_DIRECTION, "vad": SILERO_VAD, "magika": MAGIKA}[model])


def golden(inputs: Inputs, session: ort.InferenceSession) -> dict:
    """One golden sample: the inputs and plain ONNX Runtime's outputs for them, in the manifest's form."""
    outputs = run_alone(session, inputs)
    return {
        "inputs": {n: encode_tensor(a) for n, a in inputs.items()},
        "outputs": {n: encode_tensor(a) for n, a in outputs.items()},
        "atol": 1e-4,
        "rtol": 1e-3,
    }


# --- OCR text detection: PaddleOCR's detector takes sides that are multiples of 32 ---------------


def ocr_image(seed: int, height: int, width: int, batch: int = 1) -> np.ndarray:
    """A page-like batch: text lines of random 12x7 glyphs on light paper, normalised as RapidOCR does."""
    rng = np.random.default_rng(seed)
    pixels = 0.92 + 0.03 * rng.standard_normal((batch, 3, height, width), dtype=np.float32)
    for b in range(batch):
        for top in range(4, height - 14, 24):
            left = int(rng.integers(2, 10))
            while left + 8 < width - 2:
                glyph = rng.random((12, 7)) < 0.45
                pixels[b, :, top : top + 12, left : left + 7][:, glyph] = 0.05
                left += 9 + (6 if rng.random() < 0.15 else 0)  # letters, now and then a space
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    return ((np.clip(pixels, 0, 1) - mean) / std).astype(np.float32)


def ocr_requests(count: int) -> list[Inputs]:
    """Mixed shapes: heights 32..160 and widths 32..320, a few requests carrying two images."""
    heights = (32, 64, 96, 160)
    return [
        {"x": ocr_image(i, heights[i % 4], 32 * (1 + (7 * i) % 10), batch=2 if i % 5 == 0 else 1)} for i in range(count)
    ]


def ocr_golden() -> list[dict]:
    """Golden samples for the detector's archive."""
    return [golden({"x": ocr_image(1000, 64, 96)}, reference("ocr"))]


def line_requests(count: int) -> list[Inputs]:
    """Text-line crops 48 pixels high and 48 to 640 wide, as the recogniser's stage sends them."""
    widths = (48, 57, 96, 160, 192, 250, 320, 481, 640)
    return [{"x": ocr_image(2000 + i, 48, widths[(5 * i) % len(widths)], batch=1 + (i % 7 == 0))} for i in range(count)]


def line_golden() -> list[dict]:
    """Golden samples for the direction classifier's archive, at two widths."""
    return [golden({"x": ocr_image(3000 + w, 48, w)}, reference("line")) for w in (48, 320)]


# --- Silero VAD: 512-sample chunks at 16 kHz or 256 at 8 kHz, state carried between chunks -------

CHUNK = {16000: 512, 8000: 256}


def vad_audio(seed: int, rate: int, batch: int, chunks: int) -> np.ndarray:
    """`batch` streams of `chunks` chunks: a voiced-like harmonic tone in the middle, noise around it."""
    rng = np.random.default_rng(seed)
    samples = CHUNK[rate] * chunks
    t = np.arange(samples) / rate
    tone = sum(np.sin(2 * np.pi * f0 * t) / k for k, f0 in enumerate((140.0, 280.0, 420.0, 700.0), 1))
    envelope = (np.abs(t - t.mean()) < t.max() / 4).astype(np.float64)
    audio = 0.3 * tone * envelope + 0.01 * rng.standard_normal((batch, samples))
    return audio.astype(np.float32)


def vad_chunk(audio: np.ndarray, index: int, rate: int, state: np.ndarray) -> Inputs:
    """The inputs for chunk `index` of the streams, with the state the previous chunk returned."""
    n = CHUNK[rate]
    return {"input": np.ascontiguousarray(audio[:, index * n : (index + 1) * n]), "state": state,
            "sr": np.array(rate, dtype=np.int64)}  # fmt: skip


def vad_zero_state(batch: int) -> np.ndarray:
    """The state a new stream starts from."""
    return np.zeros((2, batch, 128), dtype=np.float32)


def vad_golden() -> list[dict]:
    """Golden samples at both sample rates (the graph branches on `sr`)."""
    return [
        golden(vad_chunk(vad_audio(7, rate, 1, 1), 0, rate, vad_zero_state(1)), reference("vad"))
        for rate in (16000, 8000)
    ]


# --- Magika: the first and last 1024 bytes of a file, padded with the token 256 ------------------

PADDING = 256


def magika_features(content: bytes) -> np.ndarray:
    """Magika v3's input row for a file's content: beginning then end, each 1024 tokens."""
    begin = list(content[:1024]) + [PADDING] * max(0, 1024 - len(content))
    end = [PADDING] * max(0, 1024 - len(content)) + list(content[-1024:] if content else [])
    return np.asarray(begin + end, dtype=np.int32)


@cache
def magika_rows() -> tuple[np.ndarray, ...]:
    """Feature rows for files of many kinds from this repository (code, markup, data, config, binary)."""
    patterns = ("*.py", "*.md", "*.toml", "*.ini", "*.js", "*.html", "*.json", "*.yaml", "*.ico", "*.css")
    folders = [ROOT / name for name in ("controlplane", "serving", "alerts", "dashboards", "runbooks", "migrations")]
    files: list[Path] = []
    for pattern in patterns:
        found = sorted([*ROOT.glob(pattern), *(p for folder in folders for p in folder.rglob(pattern))])
        files.extend(found[:4])
    files.append(ROOT / "Makefile")
    rows = [magika_features(path.read_bytes()) for path in files if path.is_file()]
    rows.append(magika_features(b""))  # an empty file is all padding
    return tuple(rows)


def magika_requests(count: int) -> list[Inputs]:
    """Requests of one to three files each, cycling through the rows."""
    rows = magika_rows()
    requests = []
    for i in range(count):
        size = 1 + i % 3
        requests.append({"bytes": np.stack([rows[(i * 5 + k) % len(rows)] for k in range(size)])})
    return requests


def magika_golden() -> list[dict]:
    """Golden samples for the classifier's archive."""
    return [golden({"bytes": np.stack(magika_rows()[:2])}, reference("magika"))]
