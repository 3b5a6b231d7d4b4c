"""Render deploy/kubernetes with kustomize (kubectl's built-in or the standalone binary) and read the result.

No cluster is involved: `kubectl kustomize` builds offline. Without either program the tests skip,
unless FLIGHTDECK_REQUIRE_KUBECTL is set (CI), where they fail instead.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("base", "overlays/postgres-s3", "overlays/gpu")
# `labels` with includeTemplates and components need kustomize v5 (kubectl 1.27 and later); Debian 12's
# kubernetes-client (kubectl 1.20, kustomize v2) cannot render them.
MIN_KUSTOMIZE = (5, 0)

Obj = dict[str, Any]


def _version(text: str) -> tuple[int, int] | None:
    """Return (major, minor) of the first vX.Y in `text`, or None."""
    found = re.search(r"v(\d+)\.(\d+)", text)
    return (int(found[1]), int(found[2])) if found else None


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


@functools.cache
def _find_kustomize() -> tuple[list[str] | None, str]:
    """Return (command, "") for a kustomize v5 to build with, or (None, why none is usable)."""
    why = "neither kubectl nor kustomize is installed"
    if shutil.which("kubectl"):
        embedded = json.loads(_run("kubectl", "version", "--client", "-o", "json") or "{}").get("kustomizeVersion", "")
        if (_version(embedded) or (0, 0)) >= MIN_KUSTOMIZE:
            return ["kubectl", "kustomize"], ""
        why = f"kubectl's kustomize ({embedded or 'unknown version'}) is older than v{MIN_KUSTOMIZE[0]}"
    if shutil.which("kustomize"):
        version = _version(_run("kustomize", "version"))
        if (version or (0, 0)) >= MIN_KUSTOMIZE:
            return ["kustomize", "build"], ""
        why += f"; kustomize {version} is older than v{MIN_KUSTOMIZE[0]}"
    return None, why


def kustomize_command() -> list[str]:
    """Return the command that builds a kustomization, or skip (fail when FLIGHTDECK_REQUIRE_KUBECTL is set)."""
    command, why = _find_kustomize()
    if command:
        return command
    if os.environ.get("FLIGHTDECK_REQUIRE_KUBECTL"):
        pytest.fail(f"FLIGHTDECK_REQUIRE_KUBECTL is set but {why}: install kubectl 1.27+ or kustomize v5")
    pytest.skip(f"{why}: deploy/kubernetes is not rendered (kubectl 1.27+ or kustomize v5 needed)")


def render(folder: Path) -> list[Obj]:
    """Return the objects `kustomize build folder` prints."""
    done = subprocess.run(
        [*kustomize_command(), str(folder)], capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(objects: list[Obj], kind: str, name_prefix: str = "") -> Obj:
    """Return the only object of `kind` whose name starts with `name_prefix`."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name_prefix)]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name_prefix}*"
    return found[0]


def pod_specs(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """Yield (object, pod spec) for every object that runs pods."""
    for obj in objects:
        template = obj.get("spec", {}).get("template", {})
        if "spec" in template:
            yield obj, template["spec"]


def containers(spec: Obj) -> list[Obj]:
    """Return a pod spec's init containers and containers."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def environment(objects: list[Obj], container: Obj, secrets: dict[str, str]) -> dict[str, str]:
    """Return the environment `container` gets: its ConfigMaps' data, then its own env (Secret keys from `secrets`)."""
    environ: dict[str, str] = {}
    for source in container.get("envFrom", []):
        environ.update(one(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        environ[var["name"]] = secrets[ref["key"]] if ref else var["value"]
    return environ
