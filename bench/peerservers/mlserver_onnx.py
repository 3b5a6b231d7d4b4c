"""An MLServer inference runtime for one .onnx file, for `bench.peers` (MLServer 1.7).

It runs inside MLServer's own virtual environment (`.venv-mlserver/`, made by the benchmark) and is
imported there as the top-level module `mlserver_onnx` (the benchmark puts this folder on
PYTHONPATH); nothing in Flightdeck imports it, and it imports nothing from Flightdeck. The model
settings' `parameters.extra` carry Flightdeck's ONNX Runtime session settings, so both servers
run ONNX Runtime alike and differ only in what they do around `session.run`:

    {"name": "mlp", "implementation": "mlserver_onnx.OnnxRuntimeModel",
     "max_batch_size": 32, "max_batch_time": 0.002,
     "parameters": {"uri": "/path/model.onnx", "extra": {"intra_op_threads": 1, "inter_op_threads": 1}}}

With adaptive batching on, MLServer concatenates the flat `data` lists of the requests it merged
and splits the outputs' flat lists by each request's batch size, so outputs go back flattened.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver.utils import get_model_uri

DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
DATATYPES = {np.dtype(v): k for k, v in DTYPES.items()}
OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class InputRejected(MLServerError):
    """A request whose inputs this model cannot take (answered 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=400)


def session_options(extra: dict[str, Any]) -> ort.SessionOptions:
    """Build session options from the benchmark's settings (Flightdeck's defaults where one is missing)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(extra.get("intra_op_threads", 0))
    options.inter_op_num_threads = int(extra.get("inter_op_threads", 1))
    options.graph_optimization_level = OPT_LEVELS[extra.get("graph_optimization", "all")]
    options.enable_cpu_mem_arena = bool(extra.get("enable_cpu_mem_arena", True))
    options.enable_mem_pattern = bool(extra.get("enable_mem_pattern", True))
    spinning = "1" if extra.get("allow_spinning", False) else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.log_severity_level = 3
    return options


class OnnxRuntimeModel(MLModel):
    """One ONNX Runtime session; `predict` decodes the V2 request, runs it, encodes the outputs."""

    async def load(self) -> bool:
        """Open the session (called in each parallel inference worker)."""
        uri = await get_model_uri(self._settings)
        parameters = self._settings.parameters
        extra = (parameters.extra if parameters else None) or {}
        providers = [p for p in extra.get("providers", ["CPUExecutionProvider"]) if p in ort.get_available_providers()]
        self._session = ort.InferenceSession(uri, sess_options=session_options(extra), providers=providers)
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Run one (possibly adaptively batched) request through the session."""
        feeds = {}
        for tensor in payload.inputs:
            datatype = getattr(tensor.datatype, "value", tensor.datatype)
            if datatype not in DTYPES:
                raise InputRejected(f"input {tensor.name!r}: datatype {datatype} is not supported")
            data = getattr(tensor.data, "root", tensor.data)
            try:
                feeds[tensor.name] = np.asarray(data, dtype=DTYPES[datatype]).reshape(tensor.shape)
            except ValueError as err:
                raise InputRejected(f"input {tensor.name!r}: {err}") from None
        # NOTE: synchronous on purpose: with parallel_workers it runs in an inference worker process.
        results = self._session.run(self._output_names, feeds)
        outputs = [
            ResponseOutput(name=name, shape=list(r.shape), datatype=DATATYPES[r.dtype], data=r.ravel().tolist())
            for name, r in zip(self._output_names, results)
        ]
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)
