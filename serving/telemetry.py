"""GPU telemetry through NVML (nvidia-ml-py). No GPU or no driver: an empty list, never an error."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, bool] = {}


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU."""

    index: int
    name: str
    utilization: float  # 0..1 over NVML's last sample period
    memory_used_bytes: int
    memory_total_bytes: int


def _nvml():
    """Return the initialised pynvml module, or None when NVML is unusable here."""
    with _lock:
        if "ok" not in _state:
            try:
                import pynvml

                pynvml.nvmlInit()
                _state["ok"] = True
            except Exception as exc:  # no library, no driver, no device: all mean "no GPU"
                log.debug("NVML unavailable, GPU telemetry off: %s", exc)  # every CPU-only worker: not news
                _state["ok"] = False
    if not _state["ok"]:
        return None
    import pynvml

    return pynvml


def sample_gpus() -> list[GpuSample]:
    """Read utilisation and memory of every visible GPU."""
    nvml = _nvml()
    if nvml is None:
        return []
    samples = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
            samples.append(
                GpuSample(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    utilization=util.gpu / 100.0,
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                )
            )
    except Exception as exc:
        log.warning("NVML read failed: %s", exc)
    return samples
