"""The documentation site: it builds with --strict, every shipped rule and runbook has its page, the
generated reference says what the code says, and Flightdeck serves it under /docs.

The site is built once for this file (about 15 s), into a temporary folder, as `make docs` builds it.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docsbuild import reference

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the site with `mkdocs build --strict`: a broken link, anchor or snippet fails the build."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def page(site: Path, path: str) -> str:
    return html.unescape((site / path / "index.html").read_text())


def words(site: Path, path: str) -> str:
    """The page's text without its markup (code blocks are highlighted span by span)."""
    return html.unescape(re.sub(r"<[^>]+>", "", (site / path / "index.html").read_text()))


def test_every_shipped_rule_and_runbook_has_its_page_linked_from_the_oncall_index(site: Path) -> None:
    rules = reference.shipped_rules()
    runbooks = sorted(p.stem for p in (ROOT / "runbooks").glob("*.py") if not p.name.startswith("_"))
    written = [r for r in rules if getattr(r, "slo", None) is None]
    assert len(written) >= 13 and len(rules) > len(written), "the written rules and the SLOs' burn-rate rules"
    assert runbooks and {r.name for r in reference.shipped_runbooks()} == set(runbooks)
    index = page(site, "oncall")
    for rule in rules:
        text = words(site, f"alerts/{rule.name}")
        assert rule.why in text and rule.severity.value in text, rule.name
        if rule.runbook:
            assert f"python runbooks/{rule.runbook}.py" in text, rule.name
        assert f'href="../alerts/{rule.name}/"' in index
    for name in runbooks:
        text = words(site, f"runbooks/{name}")
        assert f"python runbooks/{name}.py" in text
        assert f'href="../runbooks/{name}/"' in index


def test_the_settings_page_holds_every_setting_with_its_default(site: Path) -> None:
    from controlplane.config import Settings

    text = " ".join(words(site, "reference/settings").split())
    for name, field in Settings.model_fields.items():
        assert f"FLIGHTDECK_{name.upper()}" in text, name
        assert " ".join(str(field.description).replace("`", "").split()) in text, name


def test_the_cli_page_holds_every_command_and_option(site: Path) -> None:
    text = page(site, "reference/cli")
    for name, command in reference.cli_commands():
        assert f"<code>{name}</code>" in text, name
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-"):
                    assert opt in text, f"{name} {opt}"


def test_the_http_page_holds_every_operation_of_the_openapi_document(site: Path) -> None:
    text = page(site, "reference/http-api")
    document = reference.openapi_document()
    assert len(document["paths"]) > 40
    for path in document["paths"]:
        assert f"<code>{path}</code>" in text, path
    assert "<code>/docs" not in text, "the docs site is not part of the API"


def test_the_metrics_page_holds_every_prometheus_and_history_metric(site: Path) -> None:
    from alerts.catalogue import METRICS
    from alerts.rules import LIVE_METRICS

    text = page(site, "reference/metrics")
    metrics = reference.prometheus_metrics()
    assert {"flightdeck_inference_requests_total", "flightdeck_inference_batch_size"} <= {m.name for m in metrics}
    for name in [m.name for m in metrics] + list(METRICS) + list(LIVE_METRICS):
        assert f"<code>{name}</code>" in text, name


def test_the_rule_fields_page_holds_every_field_a_rule_file_may_set(site: Path) -> None:
    text = page(site, "reference/rule-fields")
    for where, model in reference.rule_models().items():
        assert f"<code>{where}</code>" in text
        for name, _accepts, _default in reference.model_fields(model):
            assert f"<code>{name}</code>" in text, f"{where}.{name}"


def fetch(client, path: str) -> tuple[int, bytes, dict[str, str]]:
    """GET a path; return the status, body and headers, the response closed (a file answer holds the file)."""
    response = client.get(path)
    try:
        return response.status_code, response.get_data(), dict(response.headers)
    finally:
        response.close()


def test_flightdeck_serves_the_site_under_docs_without_a_login(site: Path, app_config: dict) -> None:
    from controlplane.app import create_app

    app = create_app(app_config | {"docs_dir": str(site), "auth_reads": True})
    try:
        client = app.test_client()
        assert fetch(client, "/docs")[0] == 308
        status, body, headers = fetch(client, "/docs/")
        assert status == 200 and b"Flightdeck" in body
        assert "script-src 'self' 'unsafe-inline'" in headers["Content-Security-Policy"]
        status, body, _ = fetch(client, "/docs/alerts/high_error_rate/")
        assert status == 200 and b"runbooks/rollback.py" in body
        assert fetch(client, "/docs/alerts/high_error_rate")[0] == 308
        assert fetch(client, "/docs/search/search_index.json")[0] == 200  # the offline search
        for bad in ("/docs/no-such-page/", "/docs/../pyproject.toml", "/docs/%2e%2e/mkdocs.yml"):
            assert fetch(client, bad)[0] == 404, bad
        assert fetch(client, "/api/docs")[0] == 200, "Swagger UI stays where it was"
        assert fetch(client, "/api/engine")[0] == 401, "the API still needs a login"
    finally:
        app.extensions["flightdeck"].shutdown(5)


@pytest.mark.slow
def test_the_site_works_in_a_browser_under_its_content_security_policy(site: Path, app_config: dict) -> None:
    """Material's inline scripts, its search worker and index, all from /docs: no console error, search answers."""
    import json
    import threading

    from werkzeug.serving import make_server

    from controlplane.app import create_app
    from tests.e2e.browser import require_browser

    chromium = require_browser()
    app = create_app(app_config | {"docs_dir": str(site)})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        done = subprocess.run(
            [sys.executable, "-m", "tests.docs.browse", url, chromium],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout)
    finally:
        server.shutdown()
        app.extensions["flightdeck"].shutdown(5)
    assert seen["errors"] == [] and seen["heading"].startswith("high_error_rate"), seen
    assert seen["title"].startswith("Flightdeck") and seen["results"] > 0, seen


def test_without_a_built_site_docs_says_how_to_build_it(app_config: dict, tmp_path: Path) -> None:
    from controlplane.app import create_app

    app = create_app(app_config | {"docs_dir": str(tmp_path / "none")})
    try:
        status, body, _ = fetch(app.test_client(), "/docs/")
        assert status == 404 and b"make docs" in body
    finally:
        app.extensions["flightdeck"].shutdown(5)
