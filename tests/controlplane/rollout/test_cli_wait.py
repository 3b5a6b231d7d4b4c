"""`rollout deploy|rollback --wait` and `rollout wait`: follow a rollout and exit with its outcome.

In-process, this test's app stands in for the server (its reconciler loads, `advance` runs the
leader's controller step) and the CLI reads the same database; the last test runs the real server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.clicontext import EXIT_REFUSED, EXIT_ROLLOUT_FAILED, EXIT_TIMEOUT
from tests.controlplane.rollout.test_rollouts import advance, settle
from tests.servers import start_server

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def runner(home: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    return CliRunner()


def started_rollout(runner: CliRunner, *args: str) -> int:
    started = runner.invoke(cli, ["rollout", "deploy", "mlp", "2", *args])
    assert started.exit_code == 0, started.output
    return int(started.output.split()[1].rstrip(":"))  # "rollout 7: mlp 1 -> 2 (...)"


def test_wait_exits_0_once_the_rollout_succeeds(app, runner: CliRunner) -> None:
    rollout_id = started_rollout(runner, "--strategy", "bluegreen")
    settle(app)
    advance(app)
    waited = runner.invoke(cli, ["rollout", "wait", str(rollout_id), "--timeout", "5"])
    assert waited.exit_code == 0, waited.output
    assert f"rollout {rollout_id}: succeeded, step 1/1, 100% of traffic on version 2" in waited.output
    assert "done: succeeded" in waited.output


def test_wait_shows_each_verdict_and_times_out_on_a_paused_rollout(app, runner: CliRunner) -> None:
    policy = '{"min_requests": 1000000}'  # no step can ever see that many: the analysis is inconclusive
    rollout_id = started_rollout(runner, "--steps", "50,100", "--pause-s", "0", "--policy", policy)
    settle(app)
    advance(app)  # loaded: the first step takes 50%
    advance(app)  # its analysis: inconclusive, so the rollout pauses for a person
    waited = runner.invoke(cli, ["rollout", "wait", str(rollout_id), "--timeout", "0"])
    assert waited.exit_code == EXIT_TIMEOUT, waited.output
    assert "analysis of step 1: inconclusive" in waited.output and "a person must act" in waited.output
    assert "Error: paused: still paused after 0s" in waited.output and "Traceback" not in waited.output


def test_wait_on_an_aborted_rollout_exits_non_zero_with_the_reason(app, runner: CliRunner) -> None:
    rollout_id = started_rollout(runner, "--steps", "50,100", "--pause-s", "3600")
    settle(app)
    advance(app)
    assert runner.invoke(cli, ["rollout", "act", str(rollout_id), "abort"]).exit_code == 0
    waited = runner.invoke(cli, ["rollout", "wait", str(rollout_id)])
    assert waited.exit_code == EXIT_ROLLOUT_FAILED, waited.output
    assert "Error: aborted: aborted by" in waited.output


def test_rollback_wait_succeeds_when_the_rollout_in_flight_is_rolled_back(app, runner: CliRunner) -> None:
    started_rollout(runner, "--steps", "50,100", "--pause-s", "3600")
    settle(app)
    advance(app)
    back = runner.invoke(cli, ["rollout", "rollback", "mlp", "--wait", "--timeout", "5"])
    assert back.exit_code == 0, back.output
    assert "rolled_back" in back.output and "done: rolled_back" in back.output


def test_wait_on_no_such_rollout_is_a_one_line_error(home: Path, runner: CliRunner) -> None:
    waited = runner.invoke(cli, ["rollout", "wait", "999"])
    assert waited.exit_code == EXIT_REFUSED and "Error: rollout 999 does not exist" in waited.output


@pytest.mark.slow
def test_deploy_wait_follows_a_real_server_to_success(home: Path) -> None:
    env = {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_ROLLOUT_TICK_S": "0.1"}
    server = start_server(home, env)
    try:
        argv = [sys.executable, "-m", "controlplane", "rollout", "deploy", "mlp", "2", "--strategy", "bluegreen"]
        done = subprocess.run(
            [*argv, "--wait", "--timeout", "120"], cwd=ROOT, capture_output=True, text=True, timeout=180,
            env={"PATH": "/usr/bin:/bin", "FLIGHTDECK_HOME": str(home)},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert ": loading, step 1/1, 0% of traffic on version 2" in done.stdout
        assert ": succeeded, step 1/1, 100% of traffic on version 2" in done.stdout
    finally:
        assert server.stop() == 0


def test_a_first_deploy_waits_until_the_process_serves_it(app, runner: CliRunner) -> None:
    assert runner.invoke(cli, ["rollout", "undeploy", "mlp", "--yes"]).exit_code == 0
    # This test's app is the serving process: its reconciler thread sees the new row and loads v1.
    deployed = runner.invoke(cli, ["rollout", "deploy", "mlp", "1", "--wait", "--timeout", "60"])
    assert deployed.exit_code == 0, deployed.output
    assert ": loaded" in deployed.output and "done: loaded: 1 process(es) serve version 1" in deployed.output


def test_with_no_server_the_wait_says_why_nothing_moves(home: Path, runner: CliRunner) -> None:
    import itertools

    from controlplane.db import make_engine, session_factory
    from controlplane.rollout.follow import follow_rollout

    rollout_id = started_rollout(runner, "--strategy", "bluegreen")  # no process here loads it
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    lines: list[str] = []
    try:
        seconds = itertools.count(0, 4)  # a clock that moves 4 s per reading; polls need no real wait
        outcome = follow_rollout(
            session_factory(engine), rollout_id, lines.append, timeout_s=30, poll_s=0, clock=lambda: next(seconds)
        )
    finally:
        engine.dispose()
    assert outcome.timed_out and not outcome.ok and outcome.reason == "still loading after 30s"
    assert lines[0].startswith(f"rollout {rollout_id}: loading, step 1/1, 0% of traffic on version 2")
    assert sum("no server holds the scheduler lease" in line for line in lines) == 1
