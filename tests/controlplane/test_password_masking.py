"""A database password is never printed, wherever it sits in the URL (issue 29, item 7): the real CLI, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT, free_port

PASSWORD = "hunter2-Xq9"


def flightdeck(home: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLIGHTDECK_HOME": str(home), "FLIGHTDECK_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://fd:{PASSWORD}@127.0.0.1:{{port}}/flightdeck",
        f"postgresql+psycopg://fd@127.0.0.1:{{port}}/flightdeck?password={PASSWORD}",
        f"postgresql+psycopg://fd@127.0.0.1:{{port}}/flightdeck?sslmode=disable&password={PASSWORD}",
    ],
    ids=["user-part", "query", "query-after-another"],
)
def test_config_and_a_failed_upgrade_never_print_the_password(tmp_path: Path, url: str) -> None:
    url = url.format(port=free_port())  # nothing listens there: the connection fails
    shown = flightdeck(tmp_path, url, "config")
    assert shown.returncode == 0, shown.stderr
    assert "127.0.0.1" in shown.stdout and "***" in shown.stdout
    failed = flightdeck(tmp_path, url, "db", "upgrade")
    assert failed.returncode != 0
    assert "127.0.0.1" in failed.stderr + failed.stdout  # the error says where it tried
    for output in (shown.stdout, shown.stderr, failed.stdout, failed.stderr):
        assert PASSWORD not in output, output
