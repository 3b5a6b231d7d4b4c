"""One running Flightdeck for the public models: each is built, pushed and deployed through the product's own paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from bench.rollout import operator_token
from tests.public_models import inputs
from tests.public_models.catalogue import MAGIKA, OCR_DETECTION, OCR_DIRECTION, SILERO_VAD, PublicModel
from tests.servers import ROOT, Server, start_server, wait_until

WORKERS = 2  # every serving process must load a first-deployed model, not just the one that took the call


@dataclass
class Fleet:
    """The running server, an operator's token, its serving processes at start, and where archives are built."""

    server: Server
    token: str
    builds: Path
    processes: frozenset[str] = frozenset()

    @property
    def url(self) -> str:
        return self.server.url

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        """Call the management API as the operator."""
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(method, self.url + path, headers=headers, timeout=60, **kwargs)


@dataclass
class Deployed:
    """A public model as the server serves it, and what the registry said when it was pushed."""

    name: str
    version: str
    pushed: dict
    manifest: dict


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Start the real product (gunicorn, two workers) once for the public-model tests."""
    home = tmp_path_factory.mktemp("public-models") / "home"
    home.mkdir()
    token = operator_token(home)
    # The product's default start: the demo models are served, the public models are not known yet.
    env = {"FLIGHTDECK_WORKERS": str(WORKERS), "FLIGHTDECK_RECONCILE_POLL_MS": "200", "FLIGHTDECK_DEMO_MODELS": "true"}
    server = start_server(home, env)
    try:
        fleet = Fleet(server, token, tmp_path_factory.mktemp("archives"))

        def every_worker_reported() -> frozenset[str]:
            rows = fleet.api("GET", "/api/engine/desired").json()["processes"]
            return frozenset(row["process"] for row in rows) if len(rows) == WORKERS else frozenset()

        # Ready means one worker answers; the engine status rows say when both are up.
        fleet.processes = wait_until(every_worker_reported, timeout=120, what="both workers to report")
        yield fleet
    finally:
        code = server.stop()
        assert "Traceback" not in server.output(), server.output()[-4000:]
        assert code == 0, server.output()[-4000:]


def build_with_cli(fleet: Fleet, model: PublicModel, name: str, golden: list[dict], *flags: str) -> Path:
    """Build an archive with `python -m controlplane registry build`, as a user would, and return it."""
    golden_file = fleet.builds / f"{name}-golden.json"
    golden_file.write_text(json.dumps(golden))
    archive = fleet.builds / f"{name}-1.tar.gz"
    command = [sys.executable, "-m", "controlplane", "registry", "build", str(model.path()), str(archive)]
    command += ["--name", name, "--version", "1", "--golden", str(golden_file), *flags]
    command += ["--description", f"{model.requirement}: {model.member}"]
    env = {**os.environ, "FLIGHTDECK_HOME": str(fleet.server.home)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"registry build failed:\n{done.stdout}\n{done.stderr}"
    return archive


def push_and_deploy(fleet: Fleet, archive: Path, name: str) -> Deployed:
    """Push an archive through the API, deploy it for the first time and wait until every worker serves it."""
    assert fleet.server.get(f"/v2/models/{name}")[0] == 404, "the model must be new to the server"
    with archive.open("rb") as upload:
        pushed = fleet.api("POST", "/api/models", files={"archive": (archive.name, upload, "application/gzip")})
    assert pushed.status_code == 201, pushed.text
    assert pushed.json()["golden"]["passed"] is True, pushed.json()
    shown = fleet.api("GET", f"/api/models/{name}/versions/1")
    assert shown.status_code == 200, shown.text
    deployed = fleet.api("POST", f"/api/models/{name}/deploy", json={"version": "1"})
    assert deployed.status_code in (200, 201, 202), deployed.text

    def every_worker_serves() -> bool:
        answer = fleet.api("GET", f"/api/models/{name}/deployment")
        if answer.status_code != 200:
            return False
        rows = [p for p in answer.json()["processes"] if p["version"] == "1"]
        failed = [p["error"] for p in rows if p["state"] == "failed"]
        assert not failed, f"a worker could not load {name}: {failed}"
        loaded = {p["process"] for p in rows if p["state"] == "loaded"}
        return len(rows) == WORKERS and loaded == {p["process"] for p in rows}

    # The reconcilers do the loading; the deployment rows say when every worker has it.
    wait_until(every_worker_serves, timeout=180, what=f"every worker to load {name}")
    serving = {p["process"] for p in fleet.api("GET", f"/api/models/{name}/deployment").json()["processes"]}
    assert serving == fleet.processes, "the workers that were running at start must serve it: no restart"
    assert fleet.server.process.poll() is None
    for _ in range(2 * WORKERS):  # each call lands on some worker; all of them must say ready
        assert fleet.server.get(f"/v2/models/{name}/ready")[0] == 200
    return Deployed(name, "1", pushed.json(), shown.json()["manifest"])


@pytest.fixture(scope="session")
def ocr_detection(fleet: Fleet) -> Deployed:
    """RapidOCR's PP-OCRv4 text detector, pushed and deployed on the running server."""
    archive = build_with_cli(fleet, OCR_DETECTION, "ocr-det", inputs.ocr_golden())
    return push_and_deploy(fleet, archive, "ocr-det")


@pytest.fixture(scope="session")
def ocr_direction(fleet: Fleet) -> Deployed:
    """RapidOCR's text-line direction classifier, pushed and deployed on the running server."""
    archive = build_with_cli(fleet, OCR_DIRECTION, "ocr-line-direction", inputs.line_golden())
    return push_and_deploy(fleet, archive, "ocr-line-direction")


@pytest.fixture(scope="session")
def silero_vad(fleet: Fleet) -> Deployed:
    """Silero VAD, which must run unbatched (its state carries the batch on axis 1), pushed and deployed."""
    archive = build_with_cli(fleet, SILERO_VAD, "silero-vad", inputs.vad_golden(), "--max-batch", "0")
    return push_and_deploy(fleet, archive, "silero-vad")


@pytest.fixture(scope="session")
def magika(fleet: Fleet) -> Deployed:
    """Magika's content-type classifier, pushed and deployed."""
    archive = build_with_cli(fleet, MAGIKA, "magika", inputs.magika_golden())
    return push_and_deploy(fleet, archive, "magika")
