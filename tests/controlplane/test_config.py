"""Layered, typed settings, and the table the docs site shows of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controlplane.config import (
    DEV_SECRET,
    ConfigError,
    Settings,
    load_settings,
    mask_url,
    secret_fields,
    settings_table,
)

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_embedded_sqlite_under_home_on_the_loopback() -> None:
    settings = load_settings(environ={})
    assert settings.host == "127.0.0.1"
    assert settings.sqlalchemy_url.startswith("sqlite:///") and settings.sqlalchemy_url.endswith(
        ".flightdeck/flightdeck.db"
    )
    assert settings.home == Path(".flightdeck") and settings.log_dir == Path(".flightdeck/logs")


def test_environment_is_typed_and_overrides_win(tmp_path: Path) -> None:
    env = {
        "FLIGHTDECK_PORT": "9100",
        "FLIGHTDECK_BATCHING": "off",
        "FLIGHTDECK_MAX_QUEUE_DELAY_MS": "0.5",
        "FLIGHTDECK_HOME": str(tmp_path),
    }
    settings = load_settings(environ=env, overrides={"port": 9200})
    assert settings.port == 9200 and settings.batching is False and settings.max_queue_delay_ms == 0.5
    assert settings.home == tmp_path
    assert settings.batching_settings.enabled is False
    assert settings.runtime.device == "auto"


def test_a_toml_file_sits_between_defaults_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "flightdeck.toml"
    config.write_text("max_batch_size = 8\nport = 9000\n")
    settings = load_settings(environ={"FLIGHTDECK_CONFIG": str(config), "FLIGHTDECK_PORT": "9001"})
    assert (settings.max_batch_size, settings.port) == (8, 9001)
    config.write_text("max_batch_size = [")
    with pytest.raises(ConfigError, match="cannot read FLIGHTDECK_CONFIG"):
        load_settings(environ={"FLIGHTDECK_CONFIG": str(config)})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLIGHTDECK_PORT": "eighty"}, "FLIGHTDECK_PORT must be an integer, not 'eighty'"),
        ({"FLIGHTDECK_PORT": "-80"}, "FLIGHTDECK_PORT must be at least 1, not '-80'"),
        ({"FLIGHTDECK_PORT": "70000"}, "FLIGHTDECK_PORT must be at most 65535"),
        ({"FLIGHTDECK_BATCHING": "maybe"}, "FLIGHTDECK_BATCHING must be true or false"),
        ({"FLIGHTDECK_DEVICE": "tpu"}, "FLIGHTDECK_DEVICE must be one of auto, cpu, cuda, not 'tpu'"),
        ({"FLIGHTDECK_WORKERS": "-1"}, "FLIGHTDECK_WORKERS must be at least 0"),
        ({"FLIGHTDECK_MAX_BATCH_SIZE": "0"}, "FLIGHTDECK_MAX_BATCH_SIZE must be at least 1"),
        ({"FLIGHTDECK_LOG_SAMPLE_RATE": "2"}, "FLIGHTDECK_LOG_SAMPLE_RATE must be at most 1"),
        ({"FLIGHTDECK_DRAIN_GRACE_S": "nan"}, "FLIGHTDECK_DRAIN_GRACE_S must be a finite number"),
        ({"FLIGHTDECK_LEASE_TTL_S": "0"}, "FLIGHTDECK_LEASE_TTL_S must be more than 0"),
        ({"FLIGHTDECK_HOST": ""}, "FLIGHTDECK_HOST must not be empty"),
        (
            {"FLIGHTDECK_LOG_LEVEL": "verbose"},
            "FLIGHTDECK_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'verbose'",
        ),
        ({"FLIGHTDECK_LOG_FORMAT": "xml"}, "FLIGHTDECK_LOG_FORMAT must be one of text, json"),
        ({"FLIGHTDECK_SECRET_KEY": DEV_SECRET}, "FLIGHTDECK_SECRET_KEY is a published example value"),
        ({"FLIGHTDECK_SECRET_KEY": "s3cret-value"}, "FLIGHTDECK_SECRET_KEY is shorter than 32 characters"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(environ=env)


def test_production_starts_with_a_real_secret_or_none_configured() -> None:
    real = "kq2V7xH0tLw9Zr3bN8mYcP4sD1fG6jEa"
    settings = load_settings(environ={"FLIGHTDECK_ENV": "production", "FLIGHTDECK_SECRET_KEY": real})
    assert settings.secret_key.get_secret_value() == real and real not in repr(settings)
    # Empty: generated into HOME at start.
    assert load_settings(environ={"FLIGHTDECK_ENV": "production"}).secret_key.get_secret_value() == ""


@pytest.mark.parametrize("env", ["development", "production"])
@pytest.mark.parametrize(
    "secret",
    [
        DEV_SECRET,
        DEV_SECRET + "-but-padded-to-look-long-enough",
        "changeme",
        "ChangeMe",
        "x" * 40,
        "short-but-random-9Qz",
    ],
)
def test_a_guessable_secret_is_refused_in_every_mode(env: str, secret: str) -> None:
    with pytest.raises(ConfigError, match="FLIGHTDECK_SECRET_KEY") as refused:
        load_settings(environ={"FLIGHTDECK_ENV": env, "FLIGHTDECK_SECRET_KEY": secret})
    assert secret not in str(refused.value)  # the message names the setting, never echoes the value


def test_printing_the_settings_masks_every_secret() -> None:
    url = "postgresql+psycopg://flightdeck:hunter2-Pa55@db.example:5432/fd"
    fernet_key = "Yk3vP0n6m2B8s9Qx1Lw4Tz7Hc5Rj8Ua2Ge6Nd0Kf3Ii="
    shown = load_settings(
        environ={"FLIGHTDECK_DATABASE_URL": url, "FLIGHTDECK_SECRET_KEY": "kq2V7xH0tLw9Zr3bN8mYcP4sD1fG6jEa",
                 "FLIGHTDECK_SECRET_KEYS": fernet_key}
    ).printable()  # fmt: skip
    assert shown["database_url"] == "postgresql+psycopg://flightdeck:***@db.example:5432/fd"
    assert shown["secret_key"] == "********" and shown["secret_keys"] == "********" and shown["port"] == "8000"
    assert all("hunter2" not in v and "kq2V7x" not in v and "Yk3vP0" not in v for v in shown.values())
    assert secret_fields() == {"secret_key", "secret_keys", "database_url"}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:p@h/d", "postgresql://u:***@h/d"),
        ("postgresql+psycopg://u:p%40ss:w@h:5/d?sslmode=require", "postgresql+psycopg://u:***@h:5/d?sslmode=require"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("sqlite:////var/lib/fd/flightdeck.db", "sqlite:////var/lib/fd/flightdeck.db"),
        ("postgresql://fd@h/d?password=hunter2", "postgresql://fd@h/d?password=***"),  # libpq takes it there too
        (
            "postgresql://fd:a@h/d?sslmode=require&password=hun%26ter2&sslpassword=x",
            "postgresql://fd:***@h/d?sslmode=require&password=***&sslpassword=***",
        ),
        ("not a URL, password=hunter2", "not a URL, password=***"),
    ],
)
def test_database_urls_are_printed_without_their_password(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(environ={}, overrides={"max_batch": 3})


def test_the_settings_table_has_one_row_per_setting() -> None:
    # The docs site's settings page is this table, generated at build time (tests/docs/test_site.py).
    assert len(settings_table().splitlines()) == len(Settings.model_fields) + 2


def test_workers_follow_the_cores_unless_set() -> None:
    assert load_settings(environ={}).worker_count == min(os.cpu_count() or 1, 4)
    assert load_settings(environ={"FLIGHTDECK_WORKERS": "3"}).worker_count == 3


def test_threads_must_hold_every_request_the_engine_could_admit() -> None:
    with pytest.raises(ConfigError, match="FLIGHTDECK_THREADS=64 cannot hold a full queue"):
        load_settings(environ={"FLIGHTDECK_THREADS": "64", "FLIGHTDECK_MAX_QUEUE_SIZE": "256"})
    auto = load_settings(environ={"FLIGHTDECK_MAX_QUEUE_SIZE": "100", "FLIGHTDECK_BATCH_INSTANCES": "2"})
    assert auto.http_threads == 2 * (100 + 32 * 2) + 16
    assert load_settings(environ={"FLIGHTDECK_THREADS": "300"}).http_threads == 300


def test_a_bad_value_in_the_toml_file_names_the_variable_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "flightdeck.toml"
    config.write_text('port = "eighty"\nlog_level = "loud"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(environ={"FLIGHTDECK_CONFIG": str(config), "FLIGHTDECK_LOG_LEVEL": "warning"})
    assert (
        str(refused.value) == f"FLIGHTDECK_PORT (in {config}) must be an integer, not 'eighty'"
    )  # env fixed the level


def test_config_json_prints_the_effective_typed_settings_with_secrets_masked(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from controlplane.cli import cli

    monkeypatch.setenv("FLIGHTDECK_HOME", str(tmp_path))
    monkeypatch.setenv("FLIGHTDECK_SECRET_KEY", "kq2V7xH0tLw9Zr3bN8mYcP4sD1fG6jEa")
    monkeypatch.setenv("FLIGHTDECK_DATABASE_URL", "postgresql+psycopg://fd:hunter2-Pa55@db.example/fd")
    monkeypatch.setenv("FLIGHTDECK_MAX_BATCH_SIZE", "8")
    result = CliRunner().invoke(cli, ["config", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert set(shown) == set(Settings.model_fields)
    assert (shown["max_batch_size"], shown["batching"], shown["home"], shown["log_format"]) == (
        8,
        True,
        str(tmp_path),
        "text",
    )
    assert shown["secret_key"] == "********" and shown["database_url"] == "postgresql+psycopg://fd:***@db.example/fd"
    assert "hunter2" not in result.output and "kq2V7x" not in result.output


def test_a_bad_setting_stops_the_cli_with_the_variable_and_the_allowed_values(monkeypatch) -> None:
    from click.testing import CliRunner

    from controlplane.cli import cli

    monkeypatch.setenv("FLIGHTDECK_LOG_LEVEL", "verbose")
    result = CliRunner().invoke(cli, ["config", "--json"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "FLIGHTDECK_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'verbose'" in result.output
