"""Exemplars on the request latency histogram: a recent sampled trace in each bucket, for OpenMetrics scrapes.

`flightdeck_inference_request_seconds` (engine time per request, queue plus compute) is merged from every
gunicorn worker's multiprocess files, which keep no exemplars; exemplars are examples, not sums, so each
process keeps the last few sampled requests of each slot in memory (`offer`, called only for requests
whose trace is recorded, so none when tracing is off) and a scrape shows those of the worker that answered
it, each on the bucket its value falls in (`attach`). Prometheus asks for them with
`Accept: application/openmetrics-text` (`--enable-feature=exemplar-storage`); the text format 0.0.4 has none.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# NOTE: nothing of prometheus_client is imported here at import time: this module is reached from
# logconfig (through tracing), which gunicorn.conf.py imports before it sets PROMETHEUS_MULTIPROC_DIR,
# and prometheus_client chooses its multiprocess mode once, when it is first imported.


class _Example(NamedTuple):
    trace_id: str
    span_id: str
    value: float
    timestamp: float


FAMILY = "flightdeck_inference_request_seconds"
KEPT_PER_SLOT = 32  # recent sampled requests per (model, version, slot): enough to reach most buckets
MAX_SLOTS = 256  # versions come and go: the oldest slot's examples are dropped past this

_lock = threading.Lock()
_recent: dict[tuple[str, str, str], deque[_Example]] = {}


def offer(model: str, version: str, slot: str, seconds: float, trace_id: str, span_id: str) -> None:
    """Keep a sampled request's latency and trace ids as a possible exemplar of its slot."""
    example = _Example(trace_id, span_id, seconds, time.time())
    key = (model, version, slot)
    with _lock:
        recent = _recent.get(key)
        if recent is None:
            if len(_recent) >= MAX_SLOTS:
                del _recent[next(iter(_recent))]
            recent = _recent[key] = deque(maxlen=KEPT_PER_SLOT)
        recent.append(example)


def attach(families: Iterator[Metric]) -> Iterator[Metric]:
    """Yield the families, the request latency histogram's buckets given this process's newest exemplar each."""
    for family in families:
        if family.name == FAMILY:
            with _lock:
                recent = {key: list(examples) for key, examples in _recent.items()}
            family.samples = list(_with_exemplars(family.samples, recent))
        yield family


def _with_exemplars(samples: list, recent: dict[tuple[str, str, str], list[_Example]]) -> Iterator:
    from prometheus_client.samples import Exemplar

    lower: dict[tuple, float] = {}  # per series: the previous bucket's bound (buckets arrive in ascending order)
    for sample in samples:
        if not sample.name.endswith("_bucket"):
            yield sample
            continue
        labels = sample.labels
        series = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        upper = math.inf if labels["le"] == "+Inf" else float(labels["le"])
        low = lower.get(series, -math.inf)
        lower[series] = upper
        examples = recent.get((labels.get("model"), labels.get("version"), labels.get("slot")), ())
        chosen = next((e for e in reversed(examples) if low < e.value <= upper), None)
        if chosen is None:
            yield sample
        else:
            labels = {"trace_id": chosen.trace_id, "span_id": chosen.span_id}
            yield sample._replace(exemplar=Exemplar(labels, chosen.value, chosen.timestamp))
