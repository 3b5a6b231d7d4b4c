"""The Models page and a model's page for every state: pushed but never served, served, rolling out, undeployed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controlplane.auth import Role
from tests.controlplane.console.conftest import HOSTILE, pack_model_archive, push_archive
from tests.controlplane.console.test_pages import action_forms, deploy


@pytest.fixture
def app_config(app_config: dict) -> dict:
    """This node serves mlp and the model these tests push (the node filter leaves textcls to other nodes)."""
    return app_config | {"load_models": "mlp,scorer"}


@pytest.fixture
def scorer(app, as_role, tmp_path: Path) -> str:
    """Push two versions of a new model, `scorer`, that nobody has deployed; its newest description is hostile."""
    client, csrf = as_role(Role.OPERATOR)
    for version, description in (("1", "first scorer"), ("2", HOSTILE)):
        archive = pack_model_archive(tmp_path / f"scorer-{version}.tar.gz", "scorer", version, description)
        response = push_archive(client, csrf, archive)
        assert response.status_code == 201, response.get_json()
    return "scorer"


def row(html: str, model: str) -> str:
    return re.search(rf'<tr data-model="{model}".*?</tr>', html, re.S).group(0)


def test_the_navigation_links_the_models_page(as_role) -> None:
    client, _ = as_role(Role.VIEWER)
    html = client.get("/models").get_data(as_text=True)
    assert '<a href="/models" aria-current="page">Models</a>' in html
    assert '<a href="/models">Models</a>' in client.get("/").get_data(as_text=True)


def test_every_registry_model_is_listed_with_its_state_versions_and_what_is_live(as_role, scorer) -> None:
    client, _ = as_role(Role.VIEWER)
    html = client.get("/models").get_data(as_text=True)

    served = row(html, "mlp")
    assert 'data-state="served"' in served and ">served</span>" in served
    assert re.search(
        r'class="version" data-version="1" data-weight="100">v1 <span class="muted">\(blue, stable\)', served
    )
    never = row(html, "scorer")
    assert 'data-state="not-served"' in never and ">not served</span>" in never
    assert re.findall(r'<div data-version="(\w+)">', never) == ["2", "1"]  # newest first
    assert 'class="version"' not in never  # nothing live
    assert 'href="/models/scorer"' in never
    # textcls is deployed, but no process reports it (this node's filter leaves it to others): starting.
    starting = row(html, "textcls")
    assert 'data-state="starting"' in starting and "waiting for the serving processes to load it" in starting


def test_an_operator_gets_push_first_deploy_and_undeploy_and_a_viewer_gets_no_buttons(as_role, scorer) -> None:
    operator, _ = as_role(Role.OPERATOR)
    html = operator.get("/models").get_data(as_text=True)
    assert 'id="push-form" data-upload="/api/models"' in html and 'name="archive"' in html
    forms = {f["api"]: f for f in action_forms(html)}
    # textcls is deployed (this test app's node filter just does not load it): it is undeployed, not deployed.
    assert set(forms) == {"/api/models/scorer/deploy", "/api/models/mlp/undeploy", "/api/models/textcls/undeploy"}
    assert all(f["enabled"] == [True] for f in forms.values())
    deploy_form = re.search(r'<form[^>]*data-api="/api/models/scorer/deploy".*?</form>', html, re.S).group(0)
    assert re.findall(r'<option value="(\w+)"', deploy_form) == ["2", "1"]
    assert "Start serving scorer version {version}? Every serving process loads it" in deploy_form

    viewer, _ = as_role(Role.VIEWER)
    html = viewer.get("/models").get_data(as_text=True)
    main = html.split("<main>")[1].split("</main>")[0]
    assert action_forms(html) == [] and 'id="push-form"' not in main and "<button" not in main
    assert "need the operator role" in html


def test_undeploy_says_exactly_what_it_unloads_and_that_nothing_is_deleted(app, as_role) -> None:
    client, csrf = as_role(Role.OPERATOR)
    html = client.get("/models").get_data(as_text=True)
    undeploy = re.search(r'<form[^>]*data-api="/api/models/mlp/undeploy"[^>]*>', html).group(0)
    assert (
        'data-confirm="Stop serving mlp? Every serving process unloads v1 (blue, 100% of traffic), and inference '
        "requests for mlp get 404 until someone deploys it again. Nothing is deleted: its 2 versions stay in the "
        'registry."'
    ) in undeploy

    rollout = deploy(app, client, csrf, version="2", strategy="canary", steps=[25, 100], pause_s=3600)
    html = client.get("/models").get_data(as_text=True)
    assert "/api/models/mlp/undeploy" not in {f["api"] for f in action_forms(html)}  # the API would refuse: 409
    assert f"Rollout #{rollout['id']} is in progress: finish or abort it first." in row(html, "mlp")
    model_page = client.get("/models/mlp").get_data(as_text=True)
    assert f"Rollout #{rollout['id']} is in progress: finish or abort it before undeploying mlp." in model_page


def test_a_model_pushed_but_never_served_has_a_page_with_the_first_deploy(as_role, scorer) -> None:
    operator, _ = as_role(Role.OPERATOR)
    response = operator.get("/models/scorer")
    html = response.get_data(as_text=True)
    assert response.status_code == 200
    assert ">not served</span>" in html and "Not served: no process loads scorer." in html
    forms = {f["api"]: f for f in action_forms(html)}
    assert set(forms) == {"/api/models/scorer/deploy"}  # no rollback, no undeploy: nothing is served
    assert 'id="first-deploy-form"' in html and 'id="deploy-form"' not in html
    assert re.search(r'<tr data-version="2">\s*<td>v2</td>', html)

    viewer, _ = as_role(Role.VIEWER)
    html = viewer.get("/models/scorer").get_data(as_text=True)
    assert action_forms(html) == [] and "Deploying needs the operator role." in html


def test_names_and_descriptions_reach_the_pages_as_text(as_role, scorer) -> None:
    client, _ = as_role(Role.OPERATOR)
    for path in ("/models", "/models/scorer"):
        html = client.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html, path
    response = client.get("/models/" + HOSTILE.replace("/", "%2F"))
    assert response.status_code == 404 and "<script>alert" not in response.get_data(as_text=True)


def test_first_deploy_then_undeploy_moves_a_model_between_the_pages_states(app, as_role, scorer) -> None:
    client, csrf = as_role(Role.OPERATOR)
    services = app.extensions["flightdeck"]
    response = client.post("/api/models/scorer/deploy", json={"version": "2"}, headers={"X-CSRF-Token": csrf})
    assert response.status_code == 202, response.get_json()

    services.reconciler.reconcile()  # this process loads v2 and checks its golden samples
    html = client.get("/models").get_data(as_text=True)
    served = row(html, "scorer")
    assert 'data-state="served"' in served
    assert 'class="version" data-version="2" data-weight="100"' in served
    assert "/api/models/scorer/undeploy" in {f["api"] for f in action_forms(html)}
    model_page = client.get("/models/scorer").get_data(as_text=True)
    assert 'id="deploy-form"' in model_page and 'id="first-deploy-form"' not in model_page
    assert re.search(r'data-slot="blue" data-version="2" data-weight="100"', model_page)
    assert "Every serving process unloads v2 (blue, 100% of traffic), and inference requests for scorer" in model_page

    assert client.post("/api/models/scorer/undeploy", json={}, headers={"X-CSRF-Token": csrf}).status_code == 200
    services.reconciler.reconcile()
    html = client.get("/models").get_data(as_text=True)
    assert 'data-state="not-served"' in row(html, "scorer")
    assert "/api/models/scorer/deploy" in {f["api"] for f in action_forms(html)}
    assert 'id="first-deploy-form"' in client.get("/models/scorer").get_data(as_text=True)
    assert "scorer" not in services.engine.models()
