"""Layered, typed settings and the README's promise to document every one of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.config import DEV_SECRET, ConfigError, Settings, load_settings, mask_url, settings_table

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
        ({"FLIGHTDECK_PORT": "eighty"}, "FLIGHTDECK_PORT must be int"),
        ({"FLIGHTDECK_BATCHING": "maybe"}, "FLIGHTDECK_BATCHING must be true or false"),
        ({"FLIGHTDECK_DEVICE": "tpu"}, "FLIGHTDECK_DEVICE must be one of"),
        ({"FLIGHTDECK_WORKERS": "-1"}, "FLIGHTDECK_WORKERS must be 0 \\(auto\\) or more"),
        ({"FLIGHTDECK_LOG_SAMPLE_RATE": "2"}, "between 0 and 1"),
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
    assert settings.secret_key == real
    assert load_settings(environ={"FLIGHTDECK_ENV": "production"}).secret_key == ""  # generated into HOME at start


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
    shown = load_settings(
        environ={"FLIGHTDECK_DATABASE_URL": url, "FLIGHTDECK_SECRET_KEY": "kq2V7xH0tLw9Zr3bN8mYcP4sD1fG6jEa"}
    ).printable()
    assert shown["database_url"] == "postgresql+psycopg://flightdeck:***@db.example:5432/fd"
    assert shown["secret_key"] == "********" and shown["port"] == "8000"
    assert all("hunter2" not in v and "kq2V7x" not in v for v in shown.values())
    secret_fields = {f.name for f in Settings.__dataclass_fields__.values() if f.metadata["secret"]}
    assert secret_fields == {"secret_key", "database_url"}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:p@h/d", "postgresql://u:***@h/d"),
        ("postgresql+psycopg://u:p%40ss:w@h:5/d?sslmode=require", "postgresql+psycopg://u:***@h:5/d?sslmode=require"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("sqlite:////var/lib/fd/flightdeck.db", "sqlite:////var/lib/fd/flightdeck.db"),
    ],
)
def test_database_urls_are_printed_without_their_password(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(environ={}, overrides={"max_batch": 3})


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    for line in settings_table().splitlines()[2:]:
        name = line.split("`")[1]
        assert f"`{name}`" in readme, f"{name} is missing from the README's settings table"
    assert len(settings_table().splitlines()) == len(Settings.__dataclass_fields__) + 2


def test_workers_follow_the_cores_unless_set() -> None:
    assert load_settings(environ={}).worker_count == min(os.cpu_count() or 1, 4)
    assert load_settings(environ={"FLIGHTDECK_WORKERS": "3"}).worker_count == 3


def test_threads_must_hold_every_request_the_engine_could_admit() -> None:
    with pytest.raises(ConfigError, match="FLIGHTDECK_THREADS=64 cannot hold a full queue"):
        load_settings(environ={"FLIGHTDECK_THREADS": "64", "FLIGHTDECK_MAX_QUEUE_SIZE": "256"})
    auto = load_settings(environ={"FLIGHTDECK_MAX_QUEUE_SIZE": "100", "FLIGHTDECK_BATCH_INSTANCES": "2"})
    assert auto.http_threads == 2 * (100 + 32 * 2) + 16
    assert load_settings(environ={"FLIGHTDECK_THREADS": "300"}).http_threads == 300
