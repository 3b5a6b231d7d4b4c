"""The access commands, run as an operator on the server's shell would, and the first admin."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from controlplane.auth.bootstrap import PASSWORD_FILE, ensure_initial_admin
from controlplane.auth.cli import auth_cli, cli_actor
from controlplane.auth.passwords import verify_password
from controlplane.config import load_settings
from controlplane.db import make_engine, session_factory
from controlplane.models import ApiToken, AuditEvent, User


@pytest.fixture
def runner(home: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    return CliRunner()


@pytest.fixture
def sessions(home: Path):
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    yield session_factory(engine)
    engine.dispose()


def test_users_create_prompts_twice_then_lists(runner: CliRunner, sessions) -> None:
    result = runner.invoke(auth_cli, ["users", "create", "ada", "--role", "admin"], input="pass-word-1\npass-word-1\n")
    assert result.exit_code == 0, result.output
    assert "created user ada (admin)" in result.output and "pass-word-1" not in result.output
    mismatch = runner.invoke(
        auth_cli, ["users", "create", "bob"], input="pass-word-1\nother-word\npass-word-2\npass-word-2\n"
    )
    assert mismatch.exit_code == 0, mismatch.output  # click asks again after a mismatch
    piped = runner.invoke(
        auth_cli, ["users", "create", "cy", "--role", "operator", "--password-stdin"], input="from-a-pipe\n"
    )
    assert piped.exit_code == 0, piped.output
    listed = runner.invoke(auth_cli, ["users", "list"])
    assert [line.split()[:2] for line in listed.output.splitlines()] == [
        ["ada", "admin"],
        ["bob", "viewer"],
        ["cy", "operator"],
    ]
    with sessions() as session:
        cy = session.scalar(select(User).where(User.name == "cy"))
        assert verify_password(cy.password_hash, "from-a-pipe")
        events = list(session.scalars(select(AuditEvent)))
    assert {(e.actor, e.actor_kind, e.action, e.outcome) for e in events} == {
        (cli_actor().name, "cli", "user.create", "ok")
    }


def test_users_create_can_generate_a_password_and_refuses_duplicates(runner: CliRunner, sessions) -> None:
    result = runner.invoke(auth_cli, ["users", "create", "ada", "--role", "admin", "--generate"])
    assert result.exit_code == 0, result.output
    password = result.output.split("password (shown once): ")[1].strip()
    with sessions() as session:
        assert verify_password(session.scalar(select(User.password_hash)), password)
    again = runner.invoke(auth_cli, ["users", "create", "ada", "--generate"])
    assert again.exit_code != 0 and "already exists" in again.output and "Traceback" not in again.output
    with sessions() as session:
        outcomes = [e.outcome for e in session.scalars(select(AuditEvent).order_by(AuditEvent.id))]
    assert outcomes == ["ok", "error"]


def test_tokens_create_prints_the_secret_once_and_revoke_stops_it(runner: CliRunner, sessions) -> None:
    runner.invoke(auth_cli, ["users", "create", "otto", "--role", "operator", "--generate"])
    refused = runner.invoke(auth_cli, ["tokens", "create", "--user", "otto", "--name", "bot", "--role", "admin"])
    assert refused.exit_code != 0 and "above operator" in refused.output
    created = runner.invoke(
        auth_cli, ["tokens", "create", "--user", "otto", "--name", "bot", "--role", "viewer", "--ttl-s", "3600"]
    )
    assert created.exit_code == 0, created.output
    secret = created.output.strip().splitlines()[-1]
    assert secret.startswith("fd_")
    with sessions() as session:
        token = session.scalar(select(ApiToken))
        assert token.role == "viewer" and token.expires_at is not None and token.prefix == secret[:8]
    listed = runner.invoke(auth_cli, ["tokens", "list"])
    assert "bot" in listed.output and "active" in listed.output and secret not in listed.output
    revoked = runner.invoke(auth_cli, ["tokens", "revoke", str(token.id)])
    assert revoked.exit_code == 0 and f"token {token.id} revoked" in revoked.output
    assert "revoked" in runner.invoke(auth_cli, ["tokens", "list", "--user", "otto"]).output
    assert runner.invoke(auth_cli, ["tokens", "revoke", "999"]).exit_code != 0


def test_users_update_resets_a_password_and_disables(runner: CliRunner, sessions) -> None:
    runner.invoke(auth_cli, ["users", "create", "ada", "--role", "admin", "--generate"])
    runner.invoke(auth_cli, ["users", "create", "vic", "--generate"])
    reset = runner.invoke(auth_cli, ["users", "update", "vic", "--password-stdin", "--disable"], input="new-password\n")
    assert reset.exit_code == 0, reset.output
    with sessions() as session:
        vic = session.scalar(select(User).where(User.name == "vic"))
        assert vic.disabled and verify_password(vic.password_hash, "new-password")
    last_admin = runner.invoke(auth_cli, ["users", "update", "ada", "--role", "viewer"])
    assert last_admin.exit_code != 0 and "admin must remain" in last_admin.output


def test_audit_prints_recent_events(runner: CliRunner) -> None:
    runner.invoke(auth_cli, ["users", "create", "ada", "--role", "admin", "--generate"])
    runner.invoke(auth_cli, ["tokens", "create", "--user", "ada", "--name", "bot"])
    result = runner.invoke(auth_cli, ["audit", "--since", "-5m", "--limit", "1"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    assert "token.create" in line and "(cli)" in line and "ok" in line
    assert "fd_" not in result.output
    assert runner.invoke(auth_cli, ["audit", "--since", "2999-01-01"]).output.strip() == "no audit events in this range"
    assert runner.invoke(auth_cli, ["audit", "--since", "whenever"]).exit_code != 0


def test_ensure_initial_admin_creates_one_admin_once(home: Path, sessions, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_HOME", str(home))
    settings = load_settings()
    password = ensure_initial_admin(sessions, settings)
    assert password
    path = home / PASSWORD_FILE
    assert path.read_text().strip() == password
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_initial_admin(sessions, settings) is None
    with sessions() as session:
        (admin,) = session.scalars(select(User))
        (event,) = session.scalars(select(AuditEvent))
    assert (admin.name, admin.role) == ("admin", "admin") and verify_password(admin.password_hash, password)
    assert (event.actor, event.actor_kind, event.action) == ("system", "system", "user.create")
    assert password not in str(event.detail)


def test_ensure_initial_admin_leaves_existing_users_alone(home: Path, runner: CliRunner, sessions) -> None:
    runner.invoke(auth_cli, ["users", "create", "ops", "--role", "admin", "--generate"])
    assert ensure_initial_admin(sessions, load_settings()) is None
    assert not (home / PASSWORD_FILE).exists()
