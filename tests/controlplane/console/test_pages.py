"""What the console's pages show and offer: state, the actions a role may take, escaping, missing things."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest

from controlplane.auth import Role
from controlplane.models import AlertRecord
from tests.controlplane.console.conftest import HOSTILE


class ActionForms(HTMLParser):
    """Collect each action form (data-api) with whether its submit buttons can be pressed."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict] = []
        self._form: dict | None = None
        self._fieldset_disabled = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attr = dict(attrs)
        if tag == "form" and "data-api" in attr:
            self._form = {"api": attr["data-api"], "method": attr.get("data-method"), "enabled": []}
            self.forms.append(self._form)
        elif tag == "fieldset" and self._form is not None:
            self._fieldset_disabled = "disabled" in attr
        elif tag == "button" and self._form is not None and attr.get("type") == "submit":
            self._form["enabled"].append(not ("disabled" in attr or self._fieldset_disabled))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form, self._fieldset_disabled = None, False


def action_forms(html: str) -> list[dict]:
    parser = ActionForms()
    parser.feed(html)
    return parser.forms


def deploy(app, client, csrf: str, **body) -> dict:
    """Start a rollout and let it load and take its first step (the scheduler is off in these tests)."""
    response = client.post("/api/models/mlp/deploy", json=body, headers={"X-CSRF-Token": csrf})
    assert response.status_code == 202, response.get_json()
    services = app.extensions["flightdeck"]
    services.reconciler.reconcile()  # loads the candidate in this process
    services.advance_rollouts()  # loading -> progressing
    services.reconciler.reconcile()
    return response.get_json()


def test_overview_shows_each_model_with_its_live_version_split_and_health(as_role) -> None:
    client, _ = as_role(Role.VIEWER)
    html = client.get("/").get_data(as_text=True)

    row = re.search(r'<tr data-model="mlp">.*?</tr>', html, re.S).group(0)
    assert 'data-version="1" data-weight="100"' in row
    assert "healthy" in row
    assert "data-live" in html and 'data-live-every="5"' in html  # the page refreshes itself


def test_the_model_page_offers_what_the_rollout_allows_and_says_what_rollback_does(app, as_role) -> None:
    client, csrf = as_role(Role.OPERATOR)
    rollout = deploy(app, client, csrf, version="2", strategy="canary", steps=[25, 100], pause_s=3600)

    html = client.get("/models/mlp").get_data(as_text=True)
    apis = {f["api"] for f in action_forms(html)}
    base = f"/api/rollouts/{rollout['id']}/"
    assert {base + a for a in ("promote", "promote_all", "pause", "abort")} <= apis
    assert base + "resume" not in apis  # only a paused rollout resumes
    assert "/api/models/mlp/rollback" in apis
    assert f"Stops rollout #{rollout['id']}: all traffic for mlp returns to version 1" in html
    assert "v2" in html and "25%" in html

    client.post(base + "pause", headers={"X-CSRF-Token": csrf})
    apis = {f["api"] for f in action_forms(client.get("/models/mlp").get_data(as_text=True))}
    assert base + "resume" in apis and base + "pause" not in apis


def test_rollback_is_shown_unavailable_with_the_reason_when_there_is_nothing_to_return_to(as_role) -> None:
    client, _ = as_role(Role.OPERATOR)
    html = client.get("/models/mlp").get_data(as_text=True)
    assert "Nothing to roll back: model &#39;mlp&#39; has no earlier stable version" in html
    assert "/api/models/mlp/rollback" not in {f["api"] for f in action_forms(html)}


@pytest.mark.parametrize("path", ["/models/mlp", "/alerts", "/runbooks/rollback", "/runbooks/compact_memory"])
def test_a_viewer_gets_every_operator_action_disabled_and_an_operator_gets_them_enabled(app, as_role, path) -> None:
    viewer, _ = as_role(Role.VIEWER)
    operator, csrf = as_role(Role.OPERATOR)
    if path == "/models/mlp":
        deploy(app, operator, csrf, version="2", strategy="canary", steps=[50, 100], pause_s=3600)

    seen = action_forms(viewer.get(path).get_data(as_text=True))
    assert seen, "the page has actions"
    assert not any(any(f["enabled"]) for f in seen), seen
    offered = action_forms(operator.get(path).get_data(as_text=True))
    # Every action is open to an operator, except a runbook's real run, which waits for its dry run.
    assert all(f["enabled"] == [True] or f["enabled"] == [True, False] and "/runs" in f["api"] for f in offered), (
        offered
    )


def test_admin_forms_are_for_admins(as_role) -> None:
    operator, _ = as_role(Role.OPERATOR)
    admin, _ = as_role(Role.ADMIN)
    as_operator = operator.get("/settings").get_data(as_text=True)
    receiver_form = next(f for f in action_forms(as_operator) if f["method"] == "PUT")
    assert receiver_form["enabled"] == [False]
    assert 'id="users"' not in as_operator  # users and roles are an admin's page
    token_form = next(f for f in action_forms(as_operator) if f["api"] == "/api/tokens")
    assert token_form["enabled"] == [True]  # everyone may make tokens for themselves
    as_admin = admin.get("/settings").get_data(as_text=True)
    assert 'id="users"' in as_admin and "/api/users" in {f["api"] for f in action_forms(as_admin)}


def test_nothing_anyone_types_reaches_a_page_as_markup(app, as_role) -> None:
    operator, csrf = as_role(Role.OPERATOR)
    now = datetime.now(UTC)
    with app.extensions["flightdeck"].sessions() as db:
        db.add(AlertRecord(fingerprint="f" * 32, rule="high_error_rate", severity="P0", state="firing",
                           labels={"alertname": "high_error_rate", "model": "mlp", "version": HOSTILE},
                           value=1.0, summary=HOSTILE, pending_since=now, firing_since=now, updated_at=now))  # fmt: skip
        db.commit()
    silence = {"matchers": [{"label": "model", "value": HOSTILE}], "duration": "1h", "comment": HOSTILE}
    assert operator.post("/api/silences", json=silence, headers={"X-CSRF-Token": csrf}).status_code == 201
    app.test_client().post("/login", data={"name": HOSTILE, "password": "x", "csrf_token": "x"})
    app.test_client().post("/api/session", json={"name": HOSTILE, "password": "x"})  # an audit event named so

    pages = ["/", "/models/mlp", "/alerts", f"/alerts/{'f' * 32}", "/audit", f"/runbooks/diagnostics?out={HOSTILE}",
             f"/dashboards?model={HOSTILE}", f"/login?next={HOSTILE}"]  # fmt: skip
    for path in pages:
        html = operator.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html, path
    assert "&lt;script&gt;alert" in operator.get("/alerts").get_data(as_text=True)
    assert "&lt;script&gt;alert" in operator.get("/audit").get_data(as_text=True)


@pytest.mark.parametrize("path", ["/models/nope", "/alerts/nope", "/runbooks/nope", "/runbooks/runs/999"])
def test_something_missing_is_a_404_page_that_says_what(as_role, path) -> None:
    client, _ = as_role(Role.VIEWER)
    response = client.get(path)
    assert response.status_code == 404 and response.mimetype == "text/html"
    assert "nope" in response.get_data(as_text=True) or "999" in response.get_data(as_text=True)


def test_an_alert_page_links_its_runbook_with_the_alerts_parameters(app, as_role) -> None:
    client, _ = as_role(Role.VIEWER)
    now = datetime.now(UTC)
    with app.extensions["flightdeck"].sessions() as db:
        db.add(AlertRecord(fingerprint="a" * 32, rule="high_error_rate", severity="P0", state="firing",
                           labels={"alertname": "high_error_rate", "model": "mlp", "version": "2"}, value=0.5,
                           summary="mlp v2 fails", pending_since=now, firing_since=now, updated_at=now))  # fmt: skip
        db.commit()
    html = client.get(f"/alerts/{'a' * 32}").get_data(as_text=True)
    link = re.search(r'href="(/runbooks/rollback\?[^"]*)"', html).group(1)
    assert "model=mlp" in link
    runbook = client.get(link.replace("&amp;", "&")).get_data(as_text=True)
    assert re.search(r'name="params.model"[^>]*value="mlp"', runbook)
    for label in ("alertname", "model", "version"):  # the silence form starts with the alert's labels
        assert re.search(rf'name="matchers.\d.label" value="{label}"', html)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (10, "10s"), (90, "1m30s"), (3600, "1h"), (90000, "1d1h")])
def test_rule_durations_read_as_they_are_written(seconds, text) -> None:
    from datetime import timedelta

    from controlplane.console.alert_pages import duration_text

    assert duration_text(timedelta(seconds=seconds)) == text


def test_a_dangerous_run_waits_for_a_second_operator_whose_page_offers_the_approval(app, as_role) -> None:
    first, csrf = as_role(Role.OPERATOR)
    second, second_csrf = as_role(Role.OPERATOR)
    body = {"params": {"model": "mlp", "slot": "blue"}, "dry_run": False, "reason": "stuck slot"}
    run = first.post("/api/runbooks/drain_reload/runs", json=body, headers={"X-CSRF-Token": csrf}).get_json()
    assert run["state"] == "awaiting_approval", run

    mine = first.get(f"/runbooks/runs/{run['id']}").get_data(as_text=True)
    assert "Waiting for a second operator to approve." in mine
    assert f"/api/runbooks/runs/{run['id']}/approve" not in {f["api"] for f in action_forms(mine)}
    assert "Withdraw" in mine
    theirs = second.get(f"/runbooks/runs/{run['id']}").get_data(as_text=True)
    approve = next(f for f in action_forms(theirs) if f["api"].endswith("/approve"))
    assert approve["enabled"] == [True]
    assert 'data-live-every="1"' in theirs  # an open run's page follows it


def test_a_page_that_breaks_says_so_as_a_page_with_its_request_id(app, as_role, monkeypatch) -> None:
    from controlplane.console import admin_pages

    client, _ = as_role(Role.VIEWER)

    def broken(*args, **kwargs):
        raise RuntimeError("the audit table is on fire")

    monkeypatch.setattr(admin_pages, "list_events", broken)
    response = client.get("/audit", headers={"X-Request-ID": "req-1234"})
    html = response.get_data(as_text=True)
    assert response.status_code == 500 and response.mimetype == "text/html"
    assert "req-1234" in html and "on fire" not in html and "Traceback" not in html


def test_after_a_finished_rollout_the_rollback_button_says_which_version_returns(app, as_role) -> None:
    client, csrf = as_role(Role.OPERATOR)
    rollout = deploy(app, client, csrf, version="2", strategy="bluegreen")
    services = app.extensions["flightdeck"]
    for _ in range(5):  # blue-green: loaded and verified, then all traffic switches
        if client.get(f"/api/rollouts/{rollout['id']}").get_json()["state"] == "succeeded":
            break
        services.advance_rollouts()
        services.reconciler.reconcile()
    html = client.get("/models/mlp").get_data(as_text=True)
    assert "All traffic for mlp returns to version 1 (slot blue) at once; version 2 stays loaded." in html
    assert "Roll back to v1" in html

    assert client.post("/api/models/mlp/rollback", headers={"X-CSRF-Token": csrf}).status_code == 200
    services.reconciler.reconcile()
    html = client.get("/models/mlp").get_data(as_text=True)
    assert re.search(r'data-slot="blue" data-version="1" data-weight="100"', html)


def test_the_model_page_shows_why_the_last_rollout_stopped_with_its_evidence(app, as_role) -> None:
    client, csrf = as_role(Role.OPERATOR)
    policy = {"min_requests": 10, "slo_p99_ms": 0.001}  # every request is over this SLO
    rollout = deploy(app, client, csrf, version="2", steps=[50, 100], pause_s=0, policy=policy)
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}
    for _ in range(40):
        assert client.post("/v2/models/mlp/infer", json=body).status_code == 200
    services = app.extensions["flightdeck"]
    services.sampler.sample()
    assert services.advance_rollouts() == [f"{rollout['id']}: fail -> rolled_back"]
    html = client.get("/models/mlp").get_data(as_text=True)
    assert f"Analysis of the last rollout (#{rollout['id']}, v2: rolled_back)" in html
    row = re.search(r"<tr><td>slo</td><td>fail</td>.*?</tr>", html, re.S).group(0)
    assert "Wilson score interval" in row and "slo_p99_ms 0.001" in row
    assert re.search(r"<tr><td>error rate</td><td>pass</td><td>Fisher", html)


def test_overview_lists_the_nodes_their_processes_alive_or_gone_and_the_leader(app, as_role) -> None:
    from controlplane.clock import utcnow
    from controlplane.models import EngineStatus, SlotStatus
    from controlplane.scheduler import LeaderScheduler

    services = app.extensions["flightdeck"]
    me = services.reconciler.process
    with services.sessions() as s:  # a process of another node that fell silent a minute ago
        then = utcnow().replace(microsecond=0) - timedelta(seconds=60)
        s.add(EngineStatus(process="node-x:77", generation=1, compact_generation=0, error="", updated_at=then))
        s.add(SlotStatus(process="node-x:77", model="mlp", slot="blue", version="1", state="loaded", error="",
                         generation=1, updated_at=then))  # fmt: skip
        s.commit()
    scheduler = LeaderScheduler(services.sessions, ttl_s=30, process=me)
    try:
        assert scheduler.renew()
        client, _ = as_role(Role.VIEWER)
        html = client.get("/").get_data(as_text=True)
    finally:
        scheduler.shutdown()
    panel = re.search(r'<section class="card" aria-label="Nodes" id="cluster">.*?</section>', html, re.S).group(0)
    assert re.search(rf'Leader: <strong data-node="{re.escape(services.settings.node_name)}">', panel)
    assert f'<tr data-process="{me}" data-state="alive">' in panel
    assert '<tr data-process="node-x:77" data-state="gone">' in panel
    model = client.get("/models/mlp").get_data(as_text=True)
    assert re.search(r'data-node="node-x">node-x<div><span class="badge gone">gone</span>', model.replace("\n", "")), (
        model
    )
