"""The command line, run as an on-call engineer would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bench.rollout import operator_token
from controlplane.cli import cli

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
    assert result.exit_code == 2 and "FLIGHTDECK_PORT" in result.output and "eighty" in result.output
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
    # The one process of this one node leads; the line says since when, and that nothing is gone.
    line = re.search(
        r"node (\S+); leader (\S+) \((\S+):\d+\) since \d{4}-\d\d-\d\d [\d:]{8} UTC; 1 process\(es\) alive on 1 node\(s\)$",
        result.stdout,
        re.M,
    )
    assert line and line[1] == line[2] == line[3], result.stdout


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


def test_help_and_version_and_both_entry_points_are_one_program() -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["-h"]).output == runner.invoke(cli, ["--help"]).output
    assert "Exit status: 0 done" in runner.invoke(cli, ["-h"]).output
    assert runner.invoke(cli, ["registry", "push", "-h"]).exit_code == 0
    from controlplane import __version__

    by_module = subprocess.run(
        [sys.executable, "-m", "controlplane", "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    script = Path(sys.executable).with_name("flightdeck")
    by_script = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert by_module.stdout == by_script.stdout == f"flightdeck {__version__}\n"


def test_reads_print_json_on_request(home: Path, monkeypatch) -> None:
    import json

    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    runner = CliRunner()
    models = json.loads(runner.invoke(cli, ["models", "--json"]).output)
    assert {"name": "mlp", "versions": ["1", "2"], "serves": "1"} in models
    versions = json.loads(runner.invoke(cli, ["registry", "list", "mlp", "--json"]).output)
    assert [v["version"] for v in versions] == ["1", "2"] and all(len(v["sha256"]) == 64 for v in versions)
    deployment = json.loads(runner.invoke(cli, ["rollout", "status", "mlp", "--json"]).output)
    assert deployment["slots"]["blue"] == {"version": "1", "weight": 100}
    created = runner.invoke(cli, ["users", "create", "ada", "--role", "operator", "--generate"])
    assert created.exit_code == 0, created.output
    users = json.loads(runner.invoke(cli, ["users", "list", "--json"]).output)
    assert [(u["name"], u["role"], u["disabled"]) for u in users] == [("ada", "operator", False)]
    assert json.loads(runner.invoke(cli, ["tokens", "list", "--json"]).output) == []
    events = json.loads(runner.invoke(cli, ["audit", "--json"]).output)
    assert (events[0]["action"], events[0]["target"], events[0]["outcome"]) == ("user.create", "ada", "ok")
    history = json.loads(runner.invoke(cli, ["history", "--json"]).output)
    assert history["rows"] == [] and history["since"] < history["until"]


def test_a_missing_database_is_one_line_and_creates_nothing(tmp_path: Path, monkeypatch) -> None:
    from controlplane.clicontext import EXIT_UNAVAILABLE

    monkeypatch.setenv("FLIGHTDECK_HOME", str(tmp_path / "nowhere"))
    for argv in (["registry", "list"], ["history"], ["models"], ["rollout", "status", "mlp"], ["users", "list"]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == EXIT_UNAVAILABLE, (argv, result.output)
        assert result.output.startswith("Error: no database at ") and len(result.output.splitlines()) == 1
    assert not (tmp_path / "nowhere").exists()


def test_an_empty_database_file_says_to_upgrade(tmp_path: Path, monkeypatch) -> None:
    from controlplane.clicontext import EXIT_UNAVAILABLE

    (tmp_path / "flightdeck.db").touch()
    monkeypatch.setenv("FLIGHTDECK_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["registry", "list"])
    assert result.exit_code == EXIT_UNAVAILABLE and "has no schema" in result.output and "db upgrade" in result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) == 1


def test_a_server_that_is_down_and_a_refused_action_have_their_own_exit_status(home: Path, monkeypatch) -> None:
    from controlplane.clicontext import EXIT_REFUSED, EXIT_UNAVAILABLE

    down = CliRunner().invoke(cli, ["status", "--url", "http://127.0.0.1:9"])
    assert down.exit_code == EXIT_UNAVAILABLE and "is `flightdeck serve` running?" in down.output
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    refused = CliRunner().invoke(cli, ["rollout", "undeploy", "nothing-here", "--yes"])
    assert (
        refused.exit_code == EXIT_REFUSED and refused.output.startswith("Error: ") and "Traceback" not in refused.output
    )


def test_demo_models_skips_the_versions_the_registry_holds(home: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    result = CliRunner().invoke(cli, ["demo-models"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"{m} {v} already there" for m in ("mlp", "textcls") for v in ("1", "2")]


def test_a_database_server_that_is_down_is_one_line(tmp_path: Path, monkeypatch) -> None:
    import pytest

    from controlplane.clicontext import EXIT_UNAVAILABLE

    pytest.importorskip("psycopg", reason="psycopg is not installed")
    monkeypatch.setenv("FLIGHTDECK_HOME", str(tmp_path))
    monkeypatch.setenv("FLIGHTDECK_DATABASE_URL", "postgresql+psycopg://fd:hunter2-Pa55@127.0.0.1:9/fd")
    result = CliRunner().invoke(cli, ["registry", "list"])
    assert result.exit_code == EXIT_UNAVAILABLE and "Traceback" not in result.output, result.output
    assert result.output.startswith("Error: cannot use the database at postgresql+psycopg://fd:***@127.0.0.1:9/fd")
    assert "hunter2" not in result.output and len(result.output.splitlines()) == 1


def test_serve_caps_glibcs_malloc_arenas_unless_the_caller_chose(home: Path, monkeypatch) -> None:
    # NOTE: issue 29, item 8: one arena per thread grew the lease holder's RSS under steady load (SECURITY.md).
    execs: list[dict[str, str]] = []

    def execv(path: str, argv: list[str]) -> None:
        execs.append(dict(os.environ))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert CliRunner().invoke(cli, ["serve"]).exit_code == 0
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert CliRunner().invoke(cli, ["serve"]).exit_code == 0
    assert [e.get("MALLOC_ARENA_MAX") for e in execs] == ["2", "4"]
