"""The command line, run as an on-call engineer would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.rollout.bench import operator_token

ROOT = Path(__file__).resolve().parents[2]


def test_models_lists_the_store_and_config_hides_the_secret(home: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    monkeypatch.setenv("FLIGHTDECK_SECRET_KEY", "do-not-print-me-9Qz4xLw2Rb7Tk1Vn5Hc8")
    runner = CliRunner()
    listed = runner.invoke(cli, ["models"])
    assert listed.exit_code == 0 and "mlp: 1, 2" in listed.output and "textcls: 1, 2" in listed.output
    shown = runner.invoke(cli, ["config"])
    assert "do-not-print-me" not in shown.output and f"FLIGHTDECK_HOME={home}" in shown.output


def test_a_bad_setting_is_a_clear_error_not_a_traceback(monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_PORT", "eighty")
    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code != 0 and "FLIGHTDECK_PORT must be int" in result.output
    assert "Traceback" not in result.output


def test_db_upgrade_creates_the_schema(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "flightdeck.db").exists()


def test_status_reads_a_running_server_with_a_token(server) -> None:
    def status(token: str | None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "FLIGHTDECK_TOKEN"} | (
            {"FLIGHTDECK_TOKEN": token} if token else {}
        )
        argv = [sys.executable, "-m", "controlplane", "status", "--url", server.url]
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)

    refused = status(None)
    assert refused.returncode != 0 and "HTTP 401" in refused.stderr and "FLIGHTDECK_TOKEN" in refused.stderr
    result = status(operator_token(server.home))
    assert result.returncode == 0, result.stderr
    assert "ready=True" in result.stdout and "blue: version 1 on CPUExecutionProvider" in result.stdout


def test_status_of_a_server_that_is_not_there_says_so() -> None:
    result = CliRunner().invoke(cli, ["status", "--url", "http://127.0.0.1:9"])
    assert result.exit_code != 0 and "cannot reach http://127.0.0.1:9" in result.output


def test_config_masks_the_database_password(monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_DATABASE_URL", "postgresql+psycopg://fd:hunter2-Pa55@db.example:5432/fd")
    shown = CliRunner().invoke(cli, ["config"])
    assert shown.exit_code == 0, shown.output
    assert "hunter2" not in shown.output
    assert "FLIGHTDECK_DATABASE_URL=postgresql+psycopg://fd:***@db.example:5432/fd" in shown.output


def test_db_upgrade_does_not_print_the_database_password(tmp_path: Path, monkeypatch) -> None:
    import pytest

    pytest.importorskip("psycopg", reason="psycopg is not installed")
    from tests.pg import create_database, find_bindir, postgres_cluster

    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found")
    with postgres_cluster(bindir) as cluster:
        # The test cluster trusts local connections, so any password gets in: what matters is the output.
        url = create_database(cluster).replace("postgres@", "postgres:hunter2-Pa55@", 1)
        monkeypatch.setenv("FLIGHTDECK_HOME", str(tmp_path))
        monkeypatch.setenv("FLIGHTDECK_DATABASE_URL", url)
        result = CliRunner().invoke(cli, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output and "postgres:***@127.0.0.1" in result.output
