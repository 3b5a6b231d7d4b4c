"""The console in a real browser: headless Chromium against the real server (gunicorn, SQLite, ONNX Runtime).

One server for the module, with a rule that fires as soon as a model serves, so there is an alert
to silence. Each test logs in through the login form as the role it needs. Screenshots of every page
land in test-artifacts/console/; a page that logs a console error fails its test.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.auth import Role
from controlplane.auth import tokens as token_service
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from controlplane.rollout.deployments import undeploy
from tests.conftest import copy_home
from tests.e2e.browser import open_console, screenshot_name
from tests.servers import ChatServer, start_server, wait_until

PASSWORD = "console-password-1"
USERS = {"ada": Role.ADMIN, "otto": Role.OPERATOR, "vic": Role.VIEWER}
RULE = """
rules:
  - name: model_serving
    severity: P2
    why: a test rule that holds while a model serves one version, so the console has an alert to show
    condition: {metric: versions_live, aggregation: max, window: 10s, op: ">=", threshold: 1, by: [model]}
    for: 0s
    summary: "{model} serves {value:.0f} version(s)"
    runbook: diagnostics
"""
HOSTILE = '<img src=x onerror="document.title=1">'


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator:
    home = copy_home(template_home, tmp_path_factory.mktemp("console") / "home")
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    with session_factory(engine)() as session:
        # Serve mlp alone, so the rule below fires for one model and one silence quiets it.
        undeploy(session, "textcls", audit=lambda *args: None)
        for name, role in USERS.items():
            user = user_service.create_user(session, name, PASSWORD, role, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "e2e-reads", Role.VIEWER, datetime.now(UTC))
        session.commit()
    engine.dispose()
    rules = home.parent / "rules"
    rules.mkdir()
    (rules / "console.yaml").write_text(RULE)
    env = {
        "FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_HISTORY_INTERVAL_S": "1", "FLIGHTDECK_ALERT_INTERVAL_S": "0.5",
        "FLIGHTDECK_ROLLOUT_TICK_S": "0.2", "FLIGHTDECK_ALERT_RULES_DIR": str(rules), "FLIGHTDECK_LEASE_TTL_S": "3",
        "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16",
    }  # fmt: skip
    server = start_server(home, env)
    server.read_token = secret  # the tests check the server's state through the API as a viewer
    yield server
    assert server.stop() == 0


@pytest.fixture
def login(browser, console_server, request: pytest.FixtureRequest) -> Iterator:
    """Return log_in(user, width=1280) -> (page, log): a fresh browser context logged in through the form."""
    opened: list[tuple] = []

    def log_in(user: str, width: int = 1280, height: int = 900):
        context, page, log = open_console(browser, console_server.url, user, PASSWORD, width, height)
        opened.append((context, page, log, user))
        return page, log

    yield log_in
    failures = []
    for context, page, log, user in opened:
        page.screenshot(path=screenshot_name(request, f"{user}-last"), full_page=True)
        failures += log.unexpected()
        context.close()
    assert not failures, f"browser console errors: {failures}"


def shoot(page, request: pytest.FixtureRequest, label: str) -> None:
    page.screenshot(path=screenshot_name(request, label), full_page=True)


def api(server, path: str) -> dict:
    request = urllib.request.Request(server.url + path, headers={"Authorization": f"Bearer {server.read_token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def served_version(server) -> str:
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]})
    request = urllib.request.Request(server.url + "/v2/models/mlp/infer", data=body.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["model_version"]


def test_login_form_refuses_a_wrong_password_and_lets_the_right_one_in(browser, console_server, request) -> None:
    context = browser.new_context(base_url=console_server.url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto("/models/mlp")
    assert page.url.endswith("/login?next=/models/mlp")
    page.fill("input[name=name]", "ada")
    page.fill("input[name=password]", "not-the-password")
    page.click("button[type=submit]")
    assert page.locator("#login-error").inner_text() == "Wrong name or password."
    shoot(page, request, "login-refused")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/models/mlp")
    cookie = next(c for c in context.cookies() if c["name"] == "session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    page.click("text=Log out")
    page.wait_for_url("**/login")
    page.goto("/")
    assert "/login" in page.url
    context.close()
    assert not errors


def test_overview_shows_models_alerts_and_drawn_charts(login, console_server, request) -> None:
    page, _ = login("ada")
    row = page.locator("#models tr[data-model=mlp]")
    assert row.locator(".version").first.get_attribute("data-version") == "1"
    assert "100%" in row.inner_text()
    for figure in ("throughput", "latency", "errors", "queue"):  # drawn at load, not at the 15 s refresh
        page.wait_for_selector(f'[data-figure="{figure}"][data-drawn="true"] .main-svg', timeout=5_000)
    page.wait_for_selector("#firing-alerts >> text=model_serving", timeout=20_000)
    shoot(page, request, "overview")


def test_canary_rollout_then_one_click_rollback_flips_traffic(login, console_server, request) -> None:
    page, log = login("otto")
    page.goto("/models/mlp")
    page.select_option("#deploy-form select[name=version]", "2")
    page.select_option("#deploy-form select[name=strategy]", "canary")
    log.expect(r"status of 400")
    page.fill("#deploy-form input[name=steps]", "50, 150")  # the server's refusal shows on the page
    page.click("#deploy-form button[type=submit]")
    page.click("#confirm-ok")
    page.wait_for_selector("#flash.error >> text='steps' must rise to 100")
    assert api(console_server, "/api/models/mlp/deployment")["rollouts"] == []
    page.fill("#deploy-form input[name=steps]", "50, 100")
    page.fill("#deploy-form input[name=pause_s]", "3600")
    page.click("#deploy-form button[type=submit]")
    assert "Deploy version 2 of mlp with the canary strategy?" in page.locator("#confirm-text").inner_text()
    page.click("#confirm-ok")
    page.wait_for_selector("#flash.ok >> text=/Rollout #\\d+ started/")
    # The reconciler loads v2 into green and the live region shows half the traffic on it.
    page.wait_for_selector('#slots tr[data-slot=green][data-version="2"][data-weight="50"]', timeout=30_000)
    assert page.locator("#rollout-traffic").inner_text().startswith("50%")
    shoot(page, request, "canary-at-50")
    wait_until(lambda: served_version(console_server) == "2", 30, "v2 to serve part of the traffic")

    rollback = page.locator("#rollback form button")
    assert rollback.inner_text() == "Roll back to v1"
    rollback.click()
    assert "all traffic for mlp returns to version 1" in page.locator("#confirm-text").inner_text()
    page.click("#confirm-cancel")
    page.wait_for_selector("#flash >> text=Cancelled: nothing was changed.")
    assert api(console_server, "/api/models/mlp/deployment")["slots"]["green"]["weight"] == 50

    rollback.click()
    page.click("#confirm-ok")
    page.wait_for_selector("#flash.ok >> text=Rolled back to v1")
    page.wait_for_selector('#slots tr[data-slot=blue][data-version="1"][data-weight="100"]')
    shoot(page, request, "rolled-back")
    deployment = api(console_server, "/api/models/mlp/deployment")
    assert deployment["slots"]["blue"] == {"version": "1", "weight": 100}
    assert deployment["rollouts"][0]["state"] == "rolled_back"
    assert wait_until(lambda: all(served_version(console_server) == "1" for _ in range(20)), 30, "only v1 serving")


def test_acknowledge_then_silence_an_alert_from_its_page(login, console_server, request) -> None:
    page, _ = login("otto")
    page.goto("/alerts")
    page.wait_for_selector("#alerts-firing tr[data-rule=model_serving]", timeout=20_000)
    page.click("#alerts-firing tr[data-rule=model_serving] >> text=Acknowledge")
    page.wait_for_selector("#flash.ok >> text=Acknowledged model_serving")
    page.wait_for_selector("#alerts-firing tr[data-rule=model_serving] >> text=acknowledged by otto")
    page.click("#alerts-firing tr[data-rule=model_serving] >> text=Silence…")
    page.wait_for_url("**/alerts/*#silence")
    shoot(page, request, "alert")
    labels = [page.locator(f"input[name='matchers.{i}.label']").input_value() for i in range(3)]
    assert "model" in labels and "alertname" in labels
    page.select_option("#silence-form select[name=duration]", "1h")
    page.fill("#silence-form input[name=comment]", f"deploying {HOSTILE}")
    page.click("#silence-form button[type=submit]")
    page.wait_for_selector("#flash.ok >> text=/Silence #\\d+ created until/")
    page.goto("/alerts")
    assert page.locator("#alerts-silenced tr[data-rule=model_serving]").count() == 1
    assert page.locator("#alerts-firing tr[data-rule=model_serving]").count() == 0
    silence = page.locator("#silences tbody tr").first
    assert HOSTILE in silence.inner_text()  # shown as text, never as markup
    assert page.locator("#silences img").count() == 0 and page.title() != "1"
    shoot(page, request, "alerts-silenced")


def test_run_a_runbook_after_its_dry_run_and_read_the_output(login, console_server, request) -> None:
    page, _ = login("otto")
    page.goto("/runbooks")
    page.click("#runbooks >> text=diagnostics")
    page.wait_for_url("**/runbooks/diagnostics")
    run_button = page.locator("#run-form button[value=run]")
    assert run_button.is_disabled()
    page.fill("#run-form input[name='params.out']", "console-e2e.json")
    page.click("#run-form button[value=dry]")
    page.wait_for_selector("#flash.ok >> text=/Dry run #\\d+ succeeded/", timeout=30_000)
    assert "console-e2e.json" in page.locator("#dry-run-output").inner_text()
    assert run_button.is_enabled()
    page.fill("#run-form input[name='params.out']", "other.json")
    assert run_button.is_disabled()  # changed arguments need their own dry run
    page.fill("#run-form input[name='params.out']", "console-e2e.json")
    assert run_button.is_enabled()
    run_button.click()
    page.wait_for_url(re.compile(r".*/runbooks/runs/\d+$"))
    page.wait_for_selector("#run-state[data-state=succeeded]", timeout=60_000)
    output = page.locator("#run-output").inner_text()
    assert "console-e2e.json" in output
    assert page.locator("text=write").count() >= 1
    shoot(page, request, "runbook-run")
    written = console_server.home / "runbooks" / "console-e2e.json"
    assert json.loads(written.read_text())


def test_a_viewer_sees_no_enabled_action_and_the_server_refuses_one_anyway(login, console_server, request) -> None:
    page, log = login("vic")
    before = api(console_server, "/api/models/mlp/deployment")
    for path in ("/models/mlp", "/alerts", "/runbooks/rollback"):
        page.goto(path)
        enabled = page.locator("form[data-api] button:enabled")
        assert enabled.count() == 0, f"{path}: {enabled.all_inner_texts()}"
        shoot(page, request, f"viewer-{path.strip('/').replace('/', '-')}")
    log.expect(r"status of 403")
    status = page.evaluate(
        """async () => {
            const csrf = document.querySelector('meta[name=csrf-token]').content;
            const r = await fetch('/api/models/mlp/rollback', {method: 'POST', headers: {'X-CSRF-Token': csrf}});
            return r.status;
        }"""
    )
    assert status == 403
    assert api(console_server, "/api/models/mlp/deployment")["generation"] == before["generation"]
    page.goto("/audit?actor=vic&outcome=denied")
    assert page.locator("#audit-events tr[data-action='rollout.rollback'][data-outcome=denied]").count() >= 1


def test_settings_test_a_receiver_and_make_a_token_and_a_user(login, console_server, request) -> None:
    page, _ = login("ada")
    page.goto("/settings")
    with ChatServer() as chat:
        page.fill("#receiver-form input[name=name]", "oncall_chat")
        page.select_option("#receiver-form select[name=kind]", "webhook")
        page.fill("#receiver-form input[name='config.url']", chat.url)
        page.check("#receiver-form input[name='config.allow_http']")
        page.uncheck("#receiver-form input[name=severities][value=P2]")
        page.click("#receiver-form button[type=submit]")
        page.wait_for_selector("#flash.ok >> text=Receiver oncall_chat saved")
        row = page.locator("#receivers tr[data-receiver=oncall_chat]")
        assert "P0, P1" in row.inner_text()
        row.locator("text=Send a test message").click()
        page.wait_for_selector("#flash.ok >> text=Test to oncall_chat: ok=true")
        assert chat.received and chat.received[0]["alerts"][0]["labels"]["alertname"] == "flightdeck_test"

    page.fill("#token-form input[name=name]", "deploy-bot")
    page.select_option("#token-form select[name=role]", "operator")
    page.click("#token-form button[type=submit]")
    secret = re.search(r"fd_\S+", page.wait_for_selector("#flash.ok").inner_text()).group(0)
    page.wait_for_selector("#tokens tr >> text=deploy-bot")
    assert "deploy-bot" not in secret and secret not in page.locator("#tokens").inner_text()

    page.fill("#user-form input[name=name]", "nina")
    page.fill("#user-form input[name=password]", "a-long-password-for-nina")
    page.select_option("#user-form select[name=role]", "operator")
    page.click("#user-form button[type=submit]")
    page.wait_for_selector("#flash.ok >> text=User nina created (operator)")
    assert page.locator("#user-form input[name=password]").input_value() == ""  # the form starts afresh
    page.wait_for_selector("#users tr[data-user=nina]")
    shoot(page, request, "settings")


def test_every_page_renders_at_laptop_and_phone_width_without_console_errors(login, console_server, request) -> None:
    pages = ["/", "/models", "/models/mlp", "/dashboards", "/alerts", "/runbooks", "/runbooks/diagnostics", "/audit",
             "/settings"]  # fmt: skip
    for width in (1280, 390):
        page, _ = login("ada", width=width, height=844)
        for path in pages:
            page.goto(path)
            page.wait_for_load_state("networkidle")
            # Charts draw at once (well before their refresh timer), or the page says why not.
            for plot in page.locator(".plot").all():
                plot.locator(".main-svg").first.wait_for(timeout=5_000)
            for status in page.locator(".chart-status, #dashboard-status").all_inner_texts():
                assert status.startswith("Updated at"), f"{path}: {status}"
            label = f"{width}-{path.strip('/').replace('/', '-') or 'overview'}"
            shoot(page, request, label)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{path} is {overflow}px wider than a {width}px screen"


def test_an_admin_revokes_a_users_sessions_from_the_settings_page(login, console_server, request) -> None:
    from playwright.sync_api import expect  # NOTE: here, as browser.py does, so collection needs no Playwright

    vic, _ = login("vic")
    vic.goto("/settings")
    assert "/login" not in vic.url
    page, _ = login("ada")
    page.goto("/settings")
    rows = page.locator("#sessions-live tr[data-session]", has_text="vic")
    assert rows.count() >= 1  # this browser's login, and any an earlier test left
    assert "HeadlessChrome" in rows.first.inner_text()  # the browser, as recorded at login
    shoot(page, request, "sessions")
    while (left := rows.count()) > 0:
        rows.first.locator("button", has_text="Revoke").click()
        assert "End this session of vic?" in page.locator("#confirm-text").inner_text()
        page.click("#confirm-ok")
        page.wait_for_selector("#flash.ok >> text=Session of vic ended")
        expect(rows).to_have_count(left - 1)  # the live region refreshed without it
    vic.goto("/settings")
    vic.wait_for_url(re.compile(r".*/login.*"))  # that browser must log in again
