"""MLServer (Seldon, 1.7) as a peer of `bench.peers`: its own venv, a model repository, the command.

MLServer and its dependencies (FastAPI, uvicorn, grpcio, pydantic 2, ...) live in `.venv-mlserver/`
at the repository root, created on demand with `python -m venv` and pip, with the same onnxruntime
build and version as Flightdeck's; nothing of it enters Flightdeck's environment. Each model is
served by `mlserver_onnx.OnnxRuntimeModel` (this folder, on MLServer's PYTHONPATH) with adaptive
batching at Flightdeck's defaults (`max_batch_size` 32, `max_batch_time` 2 ms) and as many
inference worker processes (`parallel_workers`) as Flightdeck has gunicorn workers. HTTP on a free
loopback port; gRPC and metrics, which MLServer always starts, on free ports of their own; access
logs off (`debug: false`), as in production.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnxruntime

PEERS = Path(__file__).resolve().parent
ROOT = PEERS.parent.parent
VENV = ROOT / ".venv-mlserver"
MLSERVER_VERSION = "1.7"  # the 1.7.x series
# NOTE: uvloop 0.22 broke MLServer 1.7.1's inference workers ("There is no current event loop" in
# Worker._ignore_signals, SeldonIO/MLServer#2286, unfixed in 1.7.x), so it stays below 0.22.
UVLOOP = "uvloop<0.22"
# Our onnxruntime build (the GPU one after `make install ORT=gpu`) goes into MLServer's venv too.
ORT_DIST = "onnxruntime-gpu" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "onnxruntime"
OTHER_ORT_DIST = "onnxruntime" if ORT_DIST == "onnxruntime-gpu" else "onnxruntime-gpu"
INSTALL_TIMEOUT_S = 900
_PROBE = (
    "import importlib.metadata as m, mlserver, uvloop; "
    f"print(mlserver.__version__, m.version({ORT_DIST!r}), uvloop.__version__)"
)


def _installed(venv: Path) -> bool:
    """Return whether `venv` has MLServer 1.7.x, our onnxruntime build and version, and a uvloop it works with."""
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, env=_venv_env())
    if done.returncode != 0:
        return False
    mlserver_version, ort_version, uvloop_version = done.stdout.split()
    return (
        mlserver_version.startswith(MLSERVER_VERSION + ".")
        and ort_version == importlib.metadata.version(ORT_DIST)
        and tuple(int(n) for n in uvloop_version.split(".")[:2]) < (0, 22)
    )


def _venv_env() -> dict[str, str]:
    # NOTE: nothing of Flightdeck's environment (PYTHONPATH, VIRTUAL_ENV) may reach MLServer's interpreter.
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "FLIGHTDECK_", "PROMETHEUS_MULTIPROC", "NAIVE_", "MLSERVER_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def ensure_venv(venv: Path = VENV) -> Path | None:
    """Return `venv` with MLServer installed, creating it first if needed; None (and one line why) if that fails."""
    if _installed(venv):
        return venv
    ort_pin = f"{ORT_DIST}=={importlib.metadata.version(ORT_DIST)}"
    print(f"MLServer: installing mlserver=={MLSERVER_VERSION}.* and {ort_pin} into {venv.name}/ (once)", flush=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        # NOTE: the two onnxruntime builds must never go in together (as in the Makefile).
        [*pip, "uninstall", "--quiet", "--yes", OTHER_ORT_DIST],
        [*pip, "install", "--quiet", f"mlserver=={MLSERVER_VERSION}.*", ort_pin, UVLOOP],
    ]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=_venv_env(), timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"MLServer: skipped, `{' '.join(argv[-4:])}` took over {INSTALL_TIMEOUT_S} s", flush=True)
            return None
        if done.returncode != 0 and "uninstall" not in argv:  # nothing to uninstall is fine
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
            why = errors[-1] if errors else f"exit status {done.returncode}"
            print(f"MLServer: skipped, could not create {venv.name}/ (no network?): {why}", flush=True)
            return None
    if not _installed(venv):
        print(f"MLServer: skipped, {venv.name}/ was created but does not import mlserver", flush=True)
        return None
    return venv


def write_repository(
    root: Path, models: dict[str, Path], ports: dict[str, int], workers: int, batching: dict[str, Any],
    ort_settings: dict[str, Any],
) -> Path:  # fmt: skip
    """Write MLServer's settings.json and one model-settings.json per model under `root`; return `root`.

    `ports` holds http_port, grpc_port and metrics_port; `batching` holds max_batch_size and
    max_batch_time (seconds, as MLServer counts it); `ort_settings` reaches the runtime's session.
    """
    root.mkdir(parents=True, exist_ok=True)
    server = {
        "host": "127.0.0.1", **ports, "parallel_workers": workers, "debug": False,
        "metrics_dir": str(root / ".metrics"), "environments_dir": str(root / ".envs"),
        "load_models_at_startup": True,
    }  # fmt: skip
    (root / "settings.json").write_text(json.dumps(server, indent=2))
    for name, onnx_file in models.items():
        folder = root / name
        folder.mkdir(exist_ok=True)
        model = {
            "name": name, "implementation": "mlserver_onnx.OnnxRuntimeModel", **batching,
            "parameters": {"uri": str(onnx_file.resolve()), "version": "1", "extra": ort_settings},
        }  # fmt: skip
        (folder / "model-settings.json").write_text(json.dumps(model, indent=2))
    return root


def command(venv: Path, repository: Path) -> tuple[list[str], dict[str, str]]:
    """Return the argv and environment that start MLServer on `repository` (run it with cwd=repository)."""
    env = {**_venv_env(), "PYTHONPATH": str(PEERS)}
    return [str(venv / "bin" / "mlserver"), "start", str(repository)], env
