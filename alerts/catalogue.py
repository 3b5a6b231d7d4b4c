"""The history's metrics, by name: what rules may name, the API documents, and the dashboards export.

A leaf, so the rule generator (`dashboards.prometheus`) and the control plane's history read one
catalogue; `controlplane.history.query` computes each of them from stored rows.
"""

# metric -> (what it is, unit), for the API's documentation and the rules' validation.
SLOT_METRICS = {
    "requests": ("requests that reached the slot (answered, failed, timed out or refused)", "count"),
    "throughput": ("answered requests per second", "1/s"),
    "error_rate": ("server errors (the model or engine failed) / requests", "ratio"),
    "client_error_rate": ("requests the model refused for their own input (400) / requests", "ratio"),
    "timeout_rate": ("timed out / requests", "ratio"),
    "rejection_rate": ("refused (queue full) / requests", "ratio"),
    "p50": ("engine latency, 50th percentile", "ms"),
    "p90": ("engine latency, 90th percentile", "ms"),
    "p99": ("engine latency, 99th percentile", "ms"),
    "p999": ("engine latency, 99.9th percentile", "ms"),
    "latency_mean": ("engine latency, mean", "ms"),
    "queue_depth_max": ("largest queue seen by one process", "samples"),
    "queue_depth_mean": ("time-averaged queue, summed over processes", "samples"),
    "batch_size_mean": ("samples per executed batch", "samples"),
    "padding_waste": ("padded positions / positions run", "ratio"),
    "shadow_agreement": ("shadow copies whose outputs matched the live version / copies compared", "ratio"),
}
DEVICE_METRICS = {
    "gpu_utilization": ("GPU utilisation", "ratio"),
    "gpu_memory_used": ("GPU memory used", "bytes"),
    "gpu_memory_total": ("GPU memory total", "bytes"),
    "fragmentation": ("heap reserved but unused / reserved (docs: History and dashboards)", "ratio"),
    "heap_reserved": ("heap bytes held from the OS", "bytes"),
    "rss": ("resident set size of the serving process", "bytes"),
}
METRICS = {**SLOT_METRICS, **DEVICE_METRICS}
