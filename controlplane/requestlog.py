"""One structured JSON line per request: errors and slow requests always, the rest sampled.

The line goes to HOME/logs/requests.log only (see `logconfig`), which adds its timestamp and level.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

log = logging.getLogger("flightdeck.requests")  # logconfig.REQUEST_LOGGER (not imported: no Flask here)


def input_hash(tensors: dict[str, np.ndarray]) -> str:
    """Return a short digest of the inputs, so requests can be matched without logging data."""
    digest = hashlib.blake2b(digest_size=8)
    for name in sorted(tensors):
        array = tensors[name]
        digest.update(name.encode("utf-8", "surrogatepass"))  # NOTE: a name JSON allowed may hold a lone surrogate
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def sampled(request_id: str, rate: float) -> bool:
    """Decide by a hash of the request id, so every node makes the same choice for one id."""
    if rate >= 1.0:
        return True
    point = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big") / 2**64
    return point < rate


def log_request(
    record: dict[str, Any],
    *,
    status: int,
    total_ms: float,
    sample_rate: float,
    slow_ms: float,
    tensors: dict[str, np.ndarray] | None = None,
) -> None:
    """Emit the request's line if it failed, was slow, or falls in the sample (hashing inputs only then).

    Never raises: it runs after the answer is decided (in a `finally`), and a log line must not turn a
    400 into a 500; a failure here is logged once, with its traceback, as the bug it is.
    """
    try:
        _log_request(record, status, total_ms, sample_rate, slow_ms, tensors)
    except Exception:
        logging.getLogger(__name__).exception("could not write the request log line of %r", record.get("request_id"))


def _log_request(
    record: dict[str, Any],
    status: int,
    total_ms: float,
    sample_rate: float,
    slow_ms: float,
    tensors: dict[str, np.ndarray] | None,
) -> None:
    if status < 400 and total_ms < slow_ms and not sampled(record["request_id"], sample_rate):
        return
    if tensors is not None:
        record = {**record, "input_hash": input_hash(tensors)}
    level = logging.WARNING if status >= 500 or total_ms >= slow_ms else logging.INFO
    # A dict message: the JSON formatter writes its fields as they are, after the time and the level.
    line = {**dict.fromkeys(("request_id", "model", "version", "slot")), **record}  # version, slot: None if not routed
    log.log(level, {**line, "status": status, "total_ms": round(total_ms, 3)})
