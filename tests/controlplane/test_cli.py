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
    monkeypatch.setenv("FLIGHTDECK_SECRET_KEY", "do-not-print-me")
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
