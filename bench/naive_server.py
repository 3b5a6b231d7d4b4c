"""The naive peer for `bench.peers`: the Flask + gunicorn server a user would write in ten lines.

One `session.run` per request, no batching, no queue, no metrics, no request log: Open Inference
Protocol JSON in and out. It exists only to be measured against; nothing in the engine imports it.

    NAIVE_MODELS=mlp=/path/model.onnx NAIVE_INTRA_OP_THREADS=1 \\
        gunicorn -k gthread -w 2 --threads 8 bench.naive_server:app

The ONNX Runtime settings are Flightdeck's defaults (serving.runtime.session_options), so the two
servers differ in what they do around `session.run`, not in how ONNX Runtime runs.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flask import Flask, Response, request

from serving.runtime import load_session
from serving.settings import RuntimeSettings

# OIP datatype -> numpy dtype, for the types the benchmark's models use.
DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_}
DATATYPES = {np.dtype(v): k for k, v in DTYPES.items()}


def parse_models(spec: str) -> dict[str, str]:
    """Parse 'name=path,name=path' into {name: path}."""
    pairs = (item.split("=", 1) for item in spec.split(",") if item.strip())
    return {name.strip(): path.strip() for name, path in pairs}


def create_app(models: dict[str, str] | None = None, intra_op_threads: int | None = None) -> Flask:
    """Load each model into one ONNX Runtime session and serve `POST /v2/models/<name>/infer`."""
    models = models if models is not None else parse_models(os.environ.get("NAIVE_MODELS", ""))
    threads = intra_op_threads if intra_op_threads is not None else int(os.environ.get("NAIVE_INTRA_OP_THREADS", "0"))
    settings = RuntimeSettings(intra_op_threads=threads)  # device "auto", as Flightdeck's default
    sessions = {name: load_session(path, settings).session for name, path in models.items()}
    app = Flask(__name__)

    @app.get("/v2/health/ready")
    def ready() -> Response:
        return Response('{"ready":true}', mimetype="application/json")

    @app.post("/v2/models/<name>/infer")
    def infer(name: str) -> Response:
        session = sessions.get(name)
        if session is None:
            return Response(json.dumps({"error": f"unknown model {name!r}"}), 404, mimetype="application/json")
        payload = request.get_json()
        feeds = {
            i["name"]: np.asarray(i["data"], dtype=DTYPES[i["datatype"]]).reshape(i["shape"]) for i in payload["inputs"]
        }
        names = [o.name for o in session.get_outputs()]
        results = session.run(names, feeds)
        outputs = [
            {"name": n, "shape": list(r.shape), "datatype": DATATYPES[r.dtype], "data": r.ravel().tolist()}
            for n, r in zip(names, results)
        ]
        return Response(json.dumps({"model_name": name, "outputs": outputs}), mimetype="application/json")

    return app


def __getattr__(name: str) -> Flask:
    """Build `app` on first access, so importing this module (tests, the benchmark) loads no model."""
    if name == "app":
        globals()["app"] = built = create_app()
        return built
    raise AttributeError(name)
