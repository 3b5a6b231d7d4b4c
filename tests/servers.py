"""Real servers for integration tests: the product (gunicorn on 127.0.0.1, a free port) and a chat receiver."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running gunicorn master and what the test needs to talk to it."""

    process: subprocess.Popen
    url: str
    home: Path
    log: Path

    def get(self, path: str, timeout: float = 10) -> tuple[int, dict]:
        """GET a JSON document; return (status, body)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def post(
        self, path: str, body: dict | bytes, headers: dict | None = None, timeout: float = 30
    ) -> tuple[int, dict, dict]:
        """POST JSON (or raw bytes); return (status, body, headers)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        request = urllib.request.Request(self.url + path, data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.load(response), dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc), dict(exc.headers)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            return response.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the master and wait for it; return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until(check, timeout: float, what: str):
    """Poll the running system until `check()` is truthy and return it (bounded; the system does the work)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def push_and_deploy(server: Server, folders: list[Path], token: str) -> list[str]:
    """Push model folders (model.onnx + manifest.json) through the API, first-deploy v1 of each, wait until served."""
    import requests

    from controlplane.registry.archive import pack_archive

    headers = {"Authorization": f"Bearer {token}"}
    names = []
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        archive = folder.parent / f"{manifest['name']}.tar.gz"
        pack_archive(archive, manifest, {"model.onnx": folder / "model.onnx"})
        with archive.open("rb") as upload:
            pushed = requests.post(
                f"{server.url}/api/models", headers=headers, files={"archive": (archive.name, upload)}, timeout=60
            )
        assert pushed.status_code == 201, pushed.text
        deployed = requests.post(
            f"{server.url}/api/models/{manifest['name']}/deploy", headers=headers, json={"version": "1"}, timeout=60
        )
        assert deployed.status_code in (200, 201, 202), deployed.text
        names.append(manifest["name"])
    for name in names:
        wait_until(lambda n=name: server.get(f"/v2/models/{n}/ready")[0] == 200, 60, f"{name} to be served")
    return names


def start_server(home: Path, env: dict[str, str] | None = None, ready_timeout: float = 120) -> Server:
    """Start gunicorn with Flightdeck's config; return once /v2/health/ready answers 200."""
    port = free_port()
    environment = {
        **os.environ,
        "FLIGHTDECK_HOME": str(home),
        "FLIGHTDECK_HOST": "127.0.0.1",
        "FLIGHTDECK_PORT": str(port),
        "FLIGHTDECK_DEMO_MODELS": "false",
        "FLIGHTDECK_WORKERS": "1",  # the product's default follows the cores; tests about several workers say 2
        "FLIGHTDECK_RECEIVER_ALLOW": "127.0.0.1",  # the tests' chat receivers listen on loopback
        "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16",  # each worker's text-model warm-up: ~0.05 s instead of ~1.5 s
        # Batches up to the max batch size, as tests about batching expect, whatever this machine's timings say
        # (tests/serving/test_batchcost.py and test_inference_api's config test turn the cost curve on).
        "FLIGHTDECK_BATCH_LIMIT_FROM_COST": "false",
        "FLIGHTDECK_ORT_LONE_REQUEST_SESSION": "false",  # likewise: no second session timed at each load
        "FLIGHTDECK_GRPC_PORT": "0",  # no gRPC unless a test asks (with a free port): 8001 is one port for all
        **(env or {}),
    }
    environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = home / "server.log"
    home.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")],
            cwd=ROOT,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(process, f"http://127.0.0.1:{port}", home, log)
    deadline = time.monotonic() + ready_timeout
    # Poll readiness: this is the synchronisation point (the server says when it is ready).
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.output()}")
        try:
            status, _ = server.get("/v2/health/ready", timeout=2)
            if status == 200:
                return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server not ready within {ready_timeout}s:\n{server.output()}")


class ChatServer:
    """A webhook receiver that fails its first `failures` deliveries with 503 and Retry-After."""

    def __init__(self, failures: int = 0, retry_after_s: int = 120) -> None:
        self.failures = failures
        self.retry_after_s = retry_after_s
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.failures > 0:
                    outer.failures -= 1
                    self.send_response(503)
                    self.send_header("Retry-After", str(outer.retry_after_s))
                    self.end_headers()
                    return
                outer.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
