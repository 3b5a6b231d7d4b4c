"""Whose fault a failed model run is: the request's input (400) or the model and engine (500).

Measured on onnxruntime 1.32 with small graphs built with `onnx` (tests/serving/test_batch_isolation.py
keeps them honest):

- INVALID_ARGUMENT (`InvalidArgument`) is always the input: a Gather index outside the vocabulary
  ("indices element out of data bounds, idx=12345 ..."), a wrong rank, dtype or fixed dimension,
  a Conv input too small for its kernel ("Invalid input shape"), an impossible Expand.
- FAIL (`Fail`) mixes both: broadcasting or concatenating mismatched shapes and integer division
  by zero come from the input; an arena allocation failure does not. So FAIL counts as the client's
  only when its message says a shape or index was wrong.
- A Reshape that fails ("cannot be reshaped") is the model's: its target shape is the graph's own,
  and the request already matched the declared signature. Counting it as the client's would hide a
  broken version from the error-rate alert and the canary analysis (Triton reports FAIL as internal).
- Everything else (RUNTIME_EXCEPTION, ENGINE_ERROR, EP_FAIL, NOT_IMPLEMENTED, any Python error)
  is the model's or the engine's.

Runtime messages carry source paths and C++ signatures ("/onnxruntime_src/.../reshape_helper.h:84
onnxruntime::ReshapeHelper::ReshapeHelper(...) size != 0 && ... was false."); `trim` keeps the sentence
a client can act on.
"""

from __future__ import annotations

import re

# FAIL messages that name the input's shape or values as the cause (lower-cased substrings).
_INPUT_FAULTS = (
    "attempting to broadcast",
    "dimensions must match",
    "mismatched dimensions",
    "shape mismatch",
    "invalid input shape",
    "invalid dimensions",
    "out of bounds",
    "out of range",
    "division by zero",
)
_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ")
# "path/file.h:84 " then a C++ function: a signature with balanced-enough parentheses, or one word.
_LOCATION = re.compile(
    r"(?:/?[\w.+-]+/)*[\w.+-]+\.(?:h|hpp|cc|cpp|cu|cuh|c):\d+ (?:[\w:~<>,*& ]+\([^)]*\)(?: const)? |\w+ )?"
)
_ASSERTION = re.compile(r"^.*? was false\. ")
_PATH = re.compile(r"(?:/[\w.+-]+){2,}/([\w.+-]+)")


def is_input_fault(exc: BaseException) -> bool:
    """Return whether ONNX Runtime failed because of the request's input rather than the model or engine."""
    # NOTE: imported here, on the error path: the job process imports this module (through the metrics) and
    # has no use for ONNX Runtime's 20 MiB.
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    if isinstance(exc, ort_state.InvalidArgument):
        return True
    if isinstance(exc, ort_state.Fail):
        message = str(exc).lower()
        if "failed to allocate" in message:
            return False
        return any(fault in message for fault in _INPUT_FAULTS)
    return False


def trim(message: str) -> str:
    """Return a runtime message without its error-code prefix, source locations, assertions and paths."""
    text = _PREFIX.sub("", message.strip())
    if "Status Message: " in text:
        head, _, detail = text.partition("Status Message: ")
        detail = _LOCATION.sub("", detail, count=1)
        detail = _ASSERTION.sub("", detail, count=1)
        text = head + "Status Message: " + detail
    text = _LOCATION.sub("", text)
    text = _PATH.sub(r"\1", text)
    return " ".join(text.split())
