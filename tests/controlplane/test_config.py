"""Layered, typed settings and the README's promise to document every one of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.config import DEV_SECRET, ConfigError, Settings, load_settings, settings_table

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
        ({"FLIGHTDECK_ENV": "production"}, "FLIGHTDECK_SECRET_KEY must be set"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(environ=env)


def test_production_starts_with_a_real_secret() -> None:
    settings = load_settings(environ={"FLIGHTDECK_ENV": "production", "FLIGHTDECK_SECRET_KEY": "s3cret-value"})
    assert settings.secret_key != DEV_SECRET


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
