"""A server process a benchmark starts on a free loopback port: wait until it is ready, stop it."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """Return a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server the benchmark started: its port, its log, and how to wait for it and stop it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, log: Path, cwd: Path = ROOT) -> None:
        self.name, self.port, self.log = name, port, log
        with log.open("wb") as out:
            self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 180, path: str = "/v2/health/ready") -> None:
        """Poll `path` until it answers 200; raise with the server's log otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log.read_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready at {path} within {timeout_s:g}s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        """SIGTERM the master (it drains) and wait; SIGKILL if it does not exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
