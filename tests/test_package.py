"""The built wheel is the whole program: installed into a fresh venv outside the source tree, it serves.

The wheel is built from a copy of the tree (so the checkout gains no build/ folder) and installed
with --no-deps into a new virtual environment in a temporary folder; the dependencies come from
this venv's site-packages through a .pth line (no download), after the wheel's own files, so every
Flightdeck module, migration, rule, runbook, template and the gunicorn config come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import venv
from pathlib import Path

import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "test-artifacts",
    ".flightdeck",
    "var",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel and install it into a fresh venv outside the source tree; return the venv."""
    where = tmp_path_factory.mktemp("package")
    source, wheels, env_dir = where / "source", where / "wheels", where / "venv"
    shutil.copytree(ROOT, source, ignore=SKIP, symlinks=True)
    # The documentation site, built into the copy as `make docs` and the Dockerfile's build stage build it
    # before the wheel: package data, so the wheel carries it and /docs serves it.
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(source / "mkdocs.yml")],
        capture_output=True, text=True, timeout=300, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True, timeout=300)
    (wheel,) = wheels.glob("flightdeck-*.whl")
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", f"{wheel}[cpu]"], check=True, timeout=300)
    # NOTE: a .pth line appends this venv's site-packages after the new venv's own: dependencies without a
    # download, while Flightdeck itself (and its editable finder, which a plain path entry never runs) stays out.
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env_dir


def _clean_env(home: Path, port: int) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTDECK_", "PYTHON", "PROMETHEUS_"))}
    return keep | {
        "FLIGHTDECK_HOME": str(home),
        "FLIGHTDECK_PORT": str(port),
        "FLIGHTDECK_WORKERS": "1",
        "FLIGHTDECK_GRPC_PORT": "0",  # a default 8001 would be one port for every test server at once
    }


@pytest.mark.slow
def test_the_installed_wheel_carries_every_runtime_file(installed: Path, tmp_path: Path) -> None:
    code = (
        "import json, controlplane\n"
        "from importlib.resources import files\n"
        "from importlib.util import find_spec\n"  # importing wsgi would build the app
        "print(json.dumps({'controlplane': controlplane.__file__, 'wsgi': find_spec('wsgi').origin,\n"
        " 'migrations': len(list((files('migrations') / 'versions').iterdir())),\n"
        " 'rules': sorted(p.name for p in (files('alerts') / 'rules').iterdir()),\n"
        " 'runbooks': sorted(p.name for p in files('runbooks').iterdir() if p.name.endswith('.py')),\n"
        " 'gunicorn': (files('controlplane') / 'gunicorn.conf.py').is_file(),\n"
        " 'templates': (files('controlplane') / 'templates' / 'console' / 'base.html').is_file(),\n"
        " 'docs': (files('controlplane') / 'docs_site' / 'alerts' / 'high_error_rate' / 'index.html').is_file()}))"
    )
    shown = subprocess.run(
        [str(installed / "bin" / "python"), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=_clean_env(tmp_path / "home", free_port()),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert found["controlplane"].startswith(str(installed)) and found["wsgi"].startswith(str(installed))
    assert found["migrations"] >= 12 and found["gunicorn"] and found["templates"] and found["docs"]
    assert "serving.yaml" in found["rules"] and "rollback.py" in found["runbooks"]


@pytest.mark.slow
def test_flightdeck_serve_from_the_installed_wheel_gets_ready(installed: Path, tmp_path: Path) -> None:
    home, port = tmp_path / "fresh-home", free_port()
    version = subprocess.run(
        [str(installed / "bin" / "flightdeck"), "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert version.returncode == 0 and version.stdout.startswith("flightdeck "), version.stderr
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(installed / "bin" / "flightdeck"), "serve", "--host", "127.0.0.1"],
            cwd=tmp_path, env=_clean_env(home, port), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline, ready = time.monotonic() + 180, None
        # Poll readiness: the server says when it is ready, this is the synchronisation point.
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
                    ready = answer.status
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        assert ready == 200, log.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/docs/oncall/", timeout=10) as answer:
            assert answer.status == 200 and b"high_error_rate" in answer.read()  # the bundled site, offline
        assert (home / "flightdeck.db").is_file() and not (tmp_path / ".flightdeck").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0, log.read_text()
