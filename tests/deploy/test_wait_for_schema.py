"""The init container's script (overlays/postgres-s3/wait_for_schema.py), run as the pod runs it, on real databases."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.kustomize import KUBERNETES, ROOT

SCRIPT = KUBERNETES / "overlays" / "postgres-s3" / "wait_for_schema.py"


def run(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a Python program as a pod would, with FLIGHTDECK_HOME=home (SQLite there)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    environ |= {"FLIGHTDECK_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=environ, timeout=120)


def test_it_waits_for_the_migration_job_then_lets_the_pod_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    not_yet = run(home, str(SCRIPT), "--timeout", "0")
    assert not_yet.returncode == 1
    assert "is at nothing" in not_yet.stderr and "flightdeck db upgrade" in not_yet.stderr
    upgraded = run(home, "-m", "controlplane", "db", "upgrade")  # what the Job runs
    assert upgraded.returncode == 0, upgraded.stderr
    ready = run(home, str(SCRIPT), "--timeout", "0")
    assert ready.returncode == 0, ready.stderr
    assert "is at" in ready.stdout


def test_a_schema_newer_than_the_image_fails_at_once_and_says_why(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run(home, "-m", "controlplane", "db", "upgrade").returncode == 0
    with sqlite3.connect(home / "flightdeck.db") as db:
        db.execute("UPDATE alembic_version SET version_num = 'f00dfeedbeef'")  # a revision this image lacks
    newer = run(home, str(SCRIPT), "--timeout", "600")  # no waiting: the schema will not go back
    assert newer.returncode == 1
    assert "f00dfeedbeef, which this image does not know" in newer.stderr
    # What the pod's own start would have met: Alembic cannot upgrade from a revision it lacks.
    assert run(home, "-m", "controlplane", "db", "upgrade").returncode != 0


@pytest.mark.parametrize("argv", [["--timeout", "soon"], ["--wait"]])
def test_bad_arguments_are_refused(tmp_path: Path, argv: list[str]) -> None:
    assert run(tmp_path, str(SCRIPT), *argv).returncode == 2
