"""No guessable signing secret: configured and strong, or generated once into HOME and shared."""

from __future__ import annotations

import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from controlplane.auth.session_secret import SECRET_FILE, session_secret
from controlplane.config import ConfigError, load_settings


def test_with_no_secret_configured_one_is_generated_into_home_privately(tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"home": str(tmp_path / "fresh")})
    secret = session_secret(settings)
    path = tmp_path / "fresh" / SECRET_FILE
    assert path.read_text().strip() == secret and len(secret) >= 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o700
    assert session_secret(settings) == secret  # read back, not replaced
    other = load_settings(environ={}, overrides={"home": str(tmp_path / "other")})
    assert session_secret(other) != secret  # random, not a built-in value


def test_processes_racing_at_the_first_start_all_get_the_one_secret(tmp_path: Path) -> None:
    home = tmp_path / "race"
    home.mkdir()
    settings = load_settings(environ={}, overrides={"home": str(home)})
    start = threading.Barrier(8)

    def racer(_: int) -> str:
        start.wait()
        return session_secret(settings)

    with ThreadPoolExecutor(8) as pool:
        seen = set(pool.map(racer, range(8)))
    assert len(seen) == 1
    assert [p.name for p in home.iterdir()] == [SECRET_FILE]  # no scratch file left behind


def test_a_configured_secret_is_used_and_the_home_gets_no_file(tmp_path: Path) -> None:
    configured = "kq2V7xH0tLw9Zr3bN8mYcP4sD1fG6jEa-node-shared"
    settings = load_settings(environ={"FLIGHTDECK_SECRET_KEY": configured}, overrides={"home": str(tmp_path / "c")})
    assert session_secret(settings) == configured
    assert not (tmp_path / "c" / SECRET_FILE).exists()


def test_a_damaged_secret_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / SECRET_FILE).write_text("\n")
    settings = load_settings(environ={}, overrides={"home": str(tmp_path / "d")})
    with pytest.raises(ConfigError, match="holds no usable secret"):
        session_secret(settings)


def test_the_app_refuses_to_start_with_a_weak_secret_and_signs_with_the_generated_one(app_config: dict) -> None:
    from controlplane.app import create_app

    with pytest.raises(ConfigError, match="FLIGHTDECK_SECRET_KEY is a published example value"):
        create_app(app_config | {"secret_key": "dev-insecure-secret"})
    app = create_app(app_config)
    try:
        assert app.secret_key == (Path(app_config["home"]) / SECRET_FILE).read_text().strip()
    finally:
        app.extensions["flightdeck"].shutdown(5)
