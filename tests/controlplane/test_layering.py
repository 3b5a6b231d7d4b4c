"""The product's import rules: the web on top, imports one way, no cycles.

Layers (ARCHITECTURE.md): web (Flask views and console, the ASGI front, the request context) →
composition root (`services`) → domain services → infrastructure → leaves (`serving/`, `alerts/`,
`dashboards/`). Only the web layer imports Flask; the leaves import neither the control plane nor
a web framework or SQLAlchemy. No module imports a blueprint (view) module except the app factory
and the console package that registers the pages. The import graph of every product package has no
cycles, counting imports inside functions and under `TYPE_CHECKING` (a lazy or type-only import
that closes a cycle only hides it), and every module imports in a fresh interpreter whatever was
imported before it.
"""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "controlplane"
PRODUCT = ("controlplane", "serving", "alerts", "dashboards", "bench")
LEAVES = ("serving", "alerts", "dashboards")
VIEW_MODULES = {"dashboards_view", "docs_view"}  # top-level blueprints besides the `*_api` modules
MAY_IMPORT_VIEWS = {"controlplane.app", "controlplane.console"}  # they register the blueprints
NOT_IMPORTABLE = {"controlplane.__main__"}  # importing it runs the command line
OTHER_VENV = "bench.peerservers.mlserver_onnx"  # runs inside MLServer, in .venv-mlserver/
# The web layer besides the views: what serves HTTP or reads Flask's request context.
WEB_SUPPORT = {
    "controlplane.app",
    "controlplane.asgi",
    "controlplane.worker",
    "controlplane.httpprotocol",
    "controlplane.context",
    "controlplane.contract",
    "controlplane.errorhandlers",
    "controlplane.inference",
    "controlplane.openapi",
    "controlplane.auth.guard",
    "controlplane.auth.cookies",
    "controlplane.auth.login",
    "controlplane.auth.throttle",
}
WEB_FRAMEWORKS = ("flask", "werkzeug", "a2wsgi", "uvicorn", "gunicorn", "grpc", "grpc_health")
# The gRPC front (controlplane.grpcfront) is web layer, but for what the gunicorn master imports and the messages.
GRPC_NOT_WEB = {"controlplane.grpcfront", "controlplane.grpcfront.port", "controlplane.grpcfront.oip_pb2"}
NOT_WEB = {"werkzeug.security"}  # password hashing: a library function, no request in sight


def module_name(path: Path) -> str:
    """Return the dotted name of a module file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# NOTE: gunicorn.conf.py (a link to the top-level file, shipped as package data) is a config file, not a module.
MODULES = {
    module_name(path): path
    for package in PRODUCT
    if (ROOT / package).is_dir()
    for path in sorted((ROOT / package).rglob("*.py"))
    if path.stem.isidentifier()
}


def is_view(name: str) -> bool:
    """Say whether `name` is a blueprint module: `*/api.py`, a top-level API or view, or a console page."""
    parts = name.split(".")
    return parts[0] == "controlplane" and (
        parts[-1] == "api"
        or parts[-1].endswith("_api")
        or (len(parts) == 2 and parts[1] in VIEW_MODULES)
        or (parts[:2] == ["controlplane", "console"] and parts[-1].endswith("_pages"))
    )


def imported_names(name: str) -> set[str]:
    """Return every dotted name `name` imports anywhere in its body (functions and `TYPE_CHECKING` too)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return found


def imports_of(name: str) -> set[str]:
    """Return the product modules `name` imports."""
    return {target for target in imported_names(name) if target in MODULES and target != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def in_web_layer(name: str) -> bool:
    """Say whether `name` belongs to the web layer (may import Flask and the HTTP servers)."""
    return (
        is_view(name)
        or name in WEB_SUPPORT
        or name.startswith("controlplane.console")
        or (name.startswith("controlplane.grpcfront") and name not in GRPC_NOT_WEB)
    )


def test_the_rules_recognise_what_they_police() -> None:
    views = {name for name in MODULES if is_view(name)}
    assert {"controlplane.alerting.api", "controlplane.inference_api", "controlplane.history.slo_api"} <= views
    assert "controlplane.console.model_pages" in views
    assert not {"controlplane.alerting.readmodel", "controlplane.console.base", "controlplane.app"} & views
    assert "controlplane.console.base" in GRAPH["controlplane.console.model_pages"]
    assert "controlplane.models" in GRAPH["controlplane.models.alerting"]  # `from controlplane.models import Base`
    assert "controlplane.services" in GRAPH["controlplane.context"]  # imported for typing only: counted
    assert "flask" in {n.split(".")[0] for n in imported_names("controlplane.context")}
    assert not in_web_layer("controlplane.db") and in_web_layer("controlplane.console.base")


def _third_party(name: str) -> set[str]:
    return {target.split(".")[0] for target in imported_names(name) - NOT_WEB}


def test_only_the_web_layer_imports_a_web_framework() -> None:
    # NOTE: the benchmarks start peer servers (a naive Flask app, MLServer): they sit beside the product, not in it.
    offending = {
        name: sorted(_third_party(name) & set(WEB_FRAMEWORKS))
        for name in MODULES
        if not in_web_layer(name) and not name.startswith("bench")
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_the_leaves_import_no_control_plane_web_framework_or_database() -> None:
    forbidden = {"controlplane", "sqlalchemy", "alembic", *WEB_FRAMEWORKS}
    offending = {name: sorted(_third_party(name) & forbidden) for name in MODULES if name.split(".")[0] in LEAVES}
    assert {name: found for name, found in offending.items() if found} == {}


def test_no_module_imports_a_view_module_but_the_app_and_the_console() -> None:
    offending = {
        name: sorted(target for target in targets if is_view(target))
        for name, targets in GRAPH.items()
        if name not in MAY_IMPORT_VIEWS
    }
    assert {name: views for name, views in offending.items() if views} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_are_found_where_there_are_some() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycles() -> None:
    # NOTE: a package's __init__ always runs before its submodules, so a submodule may import names the
    # package defined before importing it (models/__init__ defines Base, then imports the tables).
    graph = {
        name: {target for target in targets if not name.startswith(f"{target}.")} for name, targets in GRAPH.items()
    }
    assert _cycles(graph) == []


IMPORT_ALL = """
import importlib, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        traceback.print_exc()
        sys.exit(f"importing {name} failed")
"""


@pytest.mark.parametrize("order", ["sorted", "reversed", "shuffled"])
def test_every_module_imports_in_a_fresh_interpreter_in_any_order(order: str) -> None:
    names = sorted(set(MODULES) - NOT_IMPORTABLE - {OTHER_VENV})
    if order == "reversed":
        names.reverse()
    elif order == "shuffled":
        random.Random(11).shuffle(names)
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *names], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_product_never_imports_the_benchmarks() -> None:
    offending = {name: sorted(t for t in targets if t.startswith("bench")) for name, targets in GRAPH.items()}
    assert {name: found for name, found in offending.items() if found and not name.startswith("bench")} == {}
