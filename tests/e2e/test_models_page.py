"""The Models page in a real browser: push an archive through the form, deploy it, see it served, undeploy it.

Headless Chromium against the real server (two gunicorn workers, SQLite, ONNX Runtime). The archive
is the demo MLP packed under a new name with the project's own builders; its description is hostile
markup, which must reach the page as text. Screenshots land in test-artifacts/console/.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.auth import Role
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from tests.conftest import copy_home
from tests.controlplane.console.conftest import pack_model_archive
from tests.e2e.browser import open_console, screenshot_name
from tests.servers import start_server, wait_until

PASSWORD = "models-password-1"
MODEL = "e2e-scorer"
HOSTILE = '<img src=x onerror="document.title=1">'


@pytest.fixture(scope="module")
def models_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator:
    home = copy_home(template_home, tmp_path_factory.mktemp("models") / "home")
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    with session_factory(engine)() as session:
        for name, role in (("otto", Role.OPERATOR), ("vic", Role.VIEWER)):
            user_service.create_user(session, name, PASSWORD, role, datetime.now(UTC))
        session.commit()
    engine.dispose()
    env = {
        "FLIGHTDECK_WORKERS": "2",  # a deploy and an undeploy must reach the process that did not take the request
        "FLIGHTDECK_LOAD_MODELS": f"mlp,{MODEL}",  # this node's filter: textcls is left to other nodes
        "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16",
        "FLIGHTDECK_RECONCILE_POLL_MS": "200",
        "FLIGHTDECK_MAX_ARCHIVE_BYTES": str(256 * 1024),  # the demo MLP's archive is about 100 KB
    }
    server = start_server(home, env)
    yield server
    assert server.stop() == 0


@pytest.fixture
def login(browser, models_server, request: pytest.FixtureRequest) -> Iterator:
    """Return log_in(user) -> (page, log): a fresh browser context logged in through the form."""
    opened: list[tuple] = []

    def log_in(user: str):
        context, page, log = open_console(browser, models_server.url, user, PASSWORD)
        opened.append((context, log))
        return page, log

    yield log_in
    failures = []
    for context, log in opened:
        failures += log.unexpected()
        context.close()
    assert not failures, f"browser console errors: {failures}"


def shoot(page, request: pytest.FixtureRequest, label: str) -> None:
    page.screenshot(path=screenshot_name(request, label), full_page=True)


def infer_status(server) -> tuple[int, str | None]:
    """Send one inference request for the pushed model; return (status, the version that answered)."""
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.125] * 64}]})
    request = urllib.request.Request(f"{server.url}/v2/models/{MODEL}/infer", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)["model_version"]
    except urllib.error.HTTPError as exc:
        return exc.code, None


def watch_push_status(page) -> None:
    """Record every text the push form's status line shows (the upload's progress events write it)."""
    page.evaluate(
        """() => {
            window.pushTexts = [];
            const status = document.getElementById('push-status');
            new MutationObserver(() => window.pushTexts.push(status.textContent))
                .observe(status, {childList: true, characterData: true, subtree: true});
        }"""
    )


def test_push_deploy_serve_and_undeploy_from_the_models_page(login, models_server, request, tmp_path) -> None:
    page, log = login("otto")
    page.click("nav >> text=Models")
    page.wait_for_url("**/models")
    row = page.locator(f"#registry-models tr[data-model={MODEL}]")
    assert row.count() == 0

    # A file that is not an archive: the API's reason shows, and nothing is kept.
    log.expect(r"status of 400")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"this is not a gzip file")
    page.set_input_files("#push-form input[name=archive]", str(junk))
    page.click("#push-form button[type=submit]")
    refused = page.wait_for_selector("#flash.error >> text=/Push of junk.tar.gz refused: /").inner_text()
    assert "archive is corrupt or truncated (not a readable tar.gz)" in refused, refused
    assert page.locator("#push-progress").is_hidden()
    shoot(page, request, "push-refused")

    # Larger than the server takes: refused in the page, before a byte is sent.
    too_big = tmp_path / "too-big.tar.gz"
    too_big.write_bytes(b"\0" * (300 * 1024))
    page.set_input_files("#push-form input[name=archive]", str(too_big))
    page.click("#push-form button[type=submit]")
    page.wait_for_selector("#flash.error >> text=too-big.tar.gz is 300 KB; the server takes archives up to 256 KB.")

    archive = pack_model_archive(tmp_path / f"{MODEL}.tar.gz", MODEL, "1", f"scores {HOSTILE}")
    watch_push_status(page)
    # A slow uplink (64 KiB/s), so the bar is seen part-way: the upload's progress events drive it.
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 64 * 1024})  # fmt: skip
    page.set_input_files("#push-form input[name=archive]", str(archive))
    page.click("#push-form button[type=submit]")
    page.wait_for_function("() => { const b = document.querySelector('#push-progress progress');"
                           " return b.value > 0 && b.value < b.max; }")  # fmt: skip
    shoot(page, request, "uploading")
    page.wait_for_selector(f"#flash.ok >> text=Pushed {MODEL} v1: deploy it below to serve it.")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    texts = page.evaluate("window.pushTexts")
    uploading = re.compile(rf"Uploading {MODEL}\.tar\.gz: \d+% \([\d.]+ [KM]B of [\d.]+ [KM]B\)")
    assert any(uploading.fullmatch(t) for t in texts), texts
    assert page.locator("#push-progress progress").evaluate("bar => bar.value === bar.max")
    row.wait_for()  # the table refreshed itself
    assert row.get_attribute("data-state") == "not-served"
    assert f"scores {HOSTILE}" in row.locator(".description").inner_text()  # text, never markup
    assert page.locator("#registry-models img").count() == 0 and page.title() != "1"
    shoot(page, request, "pushed")

    row.locator("select[name=version]").select_option("1")
    row.locator("button >> text=Deploy…").click()
    assert page.locator("#confirm-text").inner_text() == (
        f"Start serving {MODEL} version 1? Every serving process loads it and checks its golden samples; "
        f"then it takes all of {MODEL}'s traffic."
    )
    page.click("#confirm-ok")
    page.wait_for_selector(f"#flash.ok >> text=Deploying {MODEL} v1")
    served = f'#registry-models tr[data-model={MODEL}][data-state=served] .version[data-version="1"][data-weight="100"]'
    page.wait_for_selector(served, timeout=30_000)
    # Both workers serve it, without a restart: every answer comes from v1.
    assert wait_until(lambda: all(infer_status(models_server) == (200, "1") for _ in range(10)), 30, "v1 served")
    shoot(page, request, "served")

    row.locator("button >> text=Undeploy…").click()
    words = page.locator("#confirm-text").inner_text()
    assert words.startswith(f"Stop serving {MODEL}? Every serving process unloads v1 (blue, 100% of traffic)")
    assert words.endswith("Nothing is deleted: its 1 version stays in the registry.")
    page.click("#confirm-cancel")
    page.wait_for_selector("#flash >> text=Cancelled: nothing was changed.")
    assert infer_status(models_server) == (200, "1")

    row.locator("button >> text=Undeploy…").click()
    page.click("#confirm-ok")
    page.wait_for_selector(f"#flash.ok >> text=Undeployed {MODEL}: it is no longer served.")
    page.wait_for_selector(f"#registry-models tr[data-model={MODEL}][data-state=not-served]")
    assert wait_until(lambda: all(infer_status(models_server)[0] == 404 for _ in range(10)), 30, "no process serves it")
    shoot(page, request, "undeployed")

    page.click(f"#registry-models tr[data-model={MODEL}] >> text={MODEL}")
    page.wait_for_url(f"**/models/{MODEL}")
    assert page.locator("#first-deploy-form").count() == 1 and page.locator("#not-served").count() == 1
    shoot(page, request, "model-page-not-served")

    page.goto("/audit?actor=otto")  # each action went through the API, so each is in the audit log
    for action in ("model.push", "model.deploy", "model.undeploy"):
        assert page.locator(f"#audit-events tr[data-action='{action}'][data-outcome=ok]").count() == 1, action


def test_a_viewer_sees_the_models_but_no_button(login, request) -> None:
    page, _ = login("vic")
    page.goto("/models")
    assert page.locator("#registry-models tr[data-model=mlp][data-state=served]").count() == 1
    assert page.locator("main button, main input[type=file]").count() == 0
    assert "need the operator role" in page.locator("#push").inner_text()
    shoot(page, request, "viewer")
