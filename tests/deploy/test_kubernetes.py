"""deploy/kubernetes, checked offline: every overlay renders, validates against the Kubernetes schemas,
and says what the app needs: probe paths the app answers, a grace period that covers the drain, one
migration Job, secrets only from a Secret, settings the app accepts.
"""

from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest

from controlplane.config import PREFIX, Settings, load_settings, secret_fields
from tests.deploy.kustomize import OVERLAYS, Obj, containers, environment, one, pod_specs

# The oldest Kubernetes release still in common support, and the newest the schemas know.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
MULTI_POD = ("overlays/postgres-s3", "overlays/gpu")
# Placeholders for the Secret's keys: what `kubectl create secret` would hold (never in the manifests).
SECRET_VALUES = {
    "secret-key": "k8s-test-only-9f2c1e7a4b6d8e0f3a5c7e9b1d3f5a7c",
    "secret-keys": "Yk3vP0n6m2B8s9Qx1Lw4Tz7Hc5Rj8Ua2Ge6Nd0Kf3Ii=",  # a Fernet key
    "database-url": "postgresql+psycopg://flightdeck:pw@postgres:5432/flightdeck",
    "aws-access-key-id": "AKIAEXAMPLEEXAMPLE",
    "aws-secret-access-key": "example-secret-access-key",
}
SECRET_ENV = {PREFIX + name.upper() for name in secret_fields()} | {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
}
URL_WITH_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
MARGIN_S = 5  # beyond the preStop pause and the drain: the last history row, the lease handed on


def server(objects: list[Obj]) -> tuple[Obj, Obj]:
    """Return the Deployment and its Flightdeck container."""
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    return deployment, next(c for c in spec["containers"] if c["name"] == "flightdeck")


def settings_of(objects: list[Obj], container: Obj) -> Settings:
    """Return the settings a container's environment gives Flightdeck."""
    return load_settings(environment(objects, container, SECRET_VALUES))


def validate_service_monitor(monitor: Obj) -> None:
    """Check a ServiceMonitor's shape (a CRD: not in kubernetes-validate's schemas)."""
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) <= {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert monitor["spec"]["selector"]["matchLabels"]
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
        assert re.fullmatch(r"\d+s", endpoint["interval"]) and re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(rendered: dict[str, list[Obj]], overlay: str) -> None:
    kinds = set()
    for obj in rendered[overlay]:
        kinds.add(obj["kind"])
        if obj["kind"] == "ServiceMonitor":
            validate_service_monitor(obj)
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)  # raises, naming the field
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} <= kinds
    if overlay in MULTI_POD:
        assert {"Job", "HorizontalPodAutoscaler", "ServiceMonitor"} <= kinds


def test_the_schemas_refuse_what_kubernetes_would(rendered: dict[str, list[Obj]]) -> None:
    """The check above has teeth: a misspelt field and a wrongly typed one are refused."""
    deployment, _ = server(rendered["base"])
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "5s"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_the_service_reach_the_apps_port(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    deployment, container = server(objects)
    settings = settings_of(objects, container)
    port, grpc_port = settings.port, settings.grpc_port
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", port), ("grpc", grpc_port)]
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["readinessProbe"]["path"] == "/v2/health/ready"
    assert probes["livenessProbe"]["path"] == probes["startupProbe"]["path"] == "/v2/health/live"
    assert {probe["port"] for probe in probes.values()} == {"http"}
    service = one(objects, "Service")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, "http"), (grpc_port, "grpc")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # Nothing else behind the Service: the migration Job's pods are not endpoints.
    for obj, _ in pod_specs(objects):
        if obj is not deployment:
            assert not service["spec"]["selector"].items() <= obj["spec"]["template"]["metadata"]["labels"].items()


@pytest.fixture
def app_config(app_config: dict) -> dict:
    """The product's access control: kubelet and Prometheus send no token."""
    return {**app_config, "auth_reads": True, "inference_auth": True}


def test_the_app_answers_the_probe_and_scrape_paths(rendered: dict[str, list[Obj]], client) -> None:
    _, container = server(rendered["overlays/postgres-s3"])
    monitor = one(rendered["overlays/postgres-s3"], "ServiceMonitor")
    paths = {container[kind]["httpGet"]["path"] for kind in ("livenessProbe", "readinessProbe")}
    paths |= {endpoint["path"] for endpoint in monitor["spec"]["endpoints"]}
    assert paths == {"/v2/health/live", "/v2/health/ready", "/metrics"}
    for path in sorted(paths):
        assert client.get(path).status_code == 200, path  # no token, as kubelet and Prometheus ask
    assert client.get("/api/engine").status_code == 401  # the access control is on


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_termination_grace_covers_the_drain(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    deployment, container = server(objects)
    drain_grace_s = settings_of(objects, container).drain_grace_s
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # NOTE: the preStop pause counts against the grace period; gunicorn's graceful_timeout is the drain grace.
    assert grace >= float(pre_stop[1]) + drain_grace_s + MARGIN_S


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_migration_job_runs_db_upgrade(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    upgrading = [
        (obj["kind"], c["name"])
        for obj, spec in pod_specs(objects)
        for c in containers(spec)
        if "db upgrade" in " ".join([*c.get("command", []), *c.get("args", [])])
    ]
    deployment, container = server(objects)
    if overlay not in MULTI_POD:
        # One pod on SQLite: its own start migrates, and it is never two at once.
        assert upgrading == []
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
        return
    assert upgrading == [("Job", "migrate")]
    job = one(objects, "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]
    # Every pod waits for the schema the Job writes before its own start looks at the database.
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["python", "/etc/flightdeck/wait_for_schema.py"]
    script = one(objects, "ConfigMap", "flightdeck-wait-for-schema")["data"]["wait_for_schema.py"]
    assert "def main(" in script
    # They all run the same image, so the schema the Job writes is the one the pods wait for.
    images = {c["image"] for _, spec in pod_specs(objects) for c in containers(spec)}
    assert len(images) == 1, images
    for c in (init, job["spec"]["template"]["spec"]["containers"][0]):
        assert settings_of(objects, c).sqlalchemy_url == SECRET_VALUES["database-url"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_come_only_from_the_secret(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    assert not [o for o in objects if o["kind"] == "Secret"], "the manifests must not carry a Secret's values"
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            assert not SECRET_ENV & set(obj["data"]), obj["metadata"]["name"]
    seen = set()
    for _, spec in pod_specs(objects):
        for c in containers(spec):
            for var in c.get("env", []):
                if var["name"] in SECRET_ENV:
                    seen.add(var["name"])
                    assert var["valueFrom"]["secretKeyRef"]["name"] == "flightdeck", var
                    assert "value" not in var
    assert f"{PREFIX}SECRET_KEY" in seen
    if overlay in MULTI_POD:
        assert {f"{PREFIX}DATABASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= seen
    assert not URL_WITH_PASSWORD.search(repr(objects))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_app_accepts_every_setting_the_manifests_give(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    for _, spec in pod_specs(objects):
        # NOTE: service links would add FLIGHTDECK_PORT=tcp://... and FLIGHTDECK_SERVICE_HOST for the Service
        # named flightdeck: variables in the settings' own prefix.
        assert spec["enableServiceLinks"] is False
        for c in containers(spec):
            environ = environment(objects, c, SECRET_VALUES)
            unknown = {n for n in environ if n.startswith(PREFIX)} - {PREFIX + f.upper() for f in Settings.model_fields}
            assert not unknown, f"{c['name']}: not Flightdeck settings: {sorted(unknown)}"
            settings = load_settings(environ)
            assert settings.env == "production" and str(settings.home) == "/var/lib/flightdeck"
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if c["name"] != "wait-for-schema":
                assert {"/var/lib/flightdeck", "/tmp"} <= mounts  # the root file system is read-only
    _, container = server(objects)
    settings = settings_of(objects, container)
    # One gunicorn worker per requested core: a worker's Python work uses one.
    assert settings.worker_count == int(container["resources"]["requests"]["cpu"])
    assert (settings.sqlalchemy_url == SECRET_VALUES["database-url"]) is (overlay in MULTI_POD)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_asks_for_resources_and_runs_unprivileged(rendered: dict[str, list[Obj]], overlay: str) -> None:
    for _, spec in pod_specs(rendered[overlay]):
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
        for c in containers(spec):
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("overlay", MULTI_POD)
def test_disruptions_scaling_and_scraping_point_at_the_server(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    deployment, _ = server(objects)
    assert deployment["spec"]["replicas"] > 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]
    scaler = one(objects, "HorizontalPodAutoscaler")
    assert scaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "flightdeck"}
    assert scaler["spec"]["minReplicas"] <= deployment["spec"]["replicas"] <= scaler["spec"]["maxReplicas"]
    service = one(objects, "Service")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}


def test_the_gpu_overlay_asks_for_a_gpu_and_requires_cuda(rendered: dict[str, list[Obj]]) -> None:
    gpu = rendered["overlays/gpu"]
    _, container = server(gpu)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert settings_of(gpu, container).device == "cuda"
    images = {c["image"] for _, spec in pod_specs(gpu) for c in containers(spec)}
    assert images == {"flightdeck-gpu:latest"}
    for overlay in ("base", "overlays/postgres-s3"):
        _, cpu_container = server(rendered[overlay])
        assert "nvidia.com/gpu" not in repr(rendered[overlay])
        assert cpu_container["image"] == "flightdeck:latest"
