"""What the fuzz run found, each kept as a plain regression test: all were 500s or undocumented answers."""

from __future__ import annotations

import pytest

from controlplane.auth import Role
from tests.controlplane.conftest import token_for

HUGE = 2**70  # past a 64-bit database integer


@pytest.fixture
def admin(app) -> dict[str, str]:
    return token_for(app, "ada", Role.ADMIN)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", f"/api/rollouts/{HUGE}"),
        ("post", f"/api/runbooks/runs/{HUGE}/reject"),
        ("post", f"/api/runbooks/runs/{HUGE}/resume"),
        ("delete", f"/api/silences/{HUGE}"),
        ("delete", f"/api/tokens/{HUGE}"),
    ],
)
def test_an_id_too_large_for_the_database_is_a_404_not_an_overflow(client, admin, method: str, path: str) -> None:
    response = getattr(client, method)(path, headers=admin)
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "not_found"


def test_the_largest_database_id_still_routes(client, admin) -> None:
    response = client.get(f"/api/rollouts/{2**63 - 1}", headers=admin)
    assert response.status_code == 404
    assert response.get_json()["error"]["message"] == f"no rollout {2**63 - 1}"  # the view's answer, not routing's
    document = client.get("/api/openapi.json").get_json()
    (rollout_id,) = document["paths"]["/api/rollouts/{rollout_id}"]["get"]["parameters"]
    assert rollout_id["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


@pytest.mark.parametrize("body", [{"max_queue_size": HUGE}, {"max_batch_size": HUGE}, {"max_queue_delay_ms": 1e300}])
def test_engine_batching_limits_are_bounded(client, admin, body: dict) -> None:
    response = client.put("/api/engine/batching", json=body, headers=admin)
    assert response.status_code == 400
    assert next(iter(body)) in response.get_json()["error"]["message"]


def test_a_history_step_too_large_for_a_date_is_a_400(client, admin) -> None:
    response = client.get(f"/api/history?metric=error_rate&start=-5m&step={HUGE}", headers=admin)
    assert response.status_code == 400 and "step" in response.get_json()["error"]["message"]


def test_a_missing_docs_asset_is_a_documented_404(client) -> None:
    assert client.get("/api/docs/assets/no-such-file.js").status_code == 404
    document = client.get("/api/openapi.json").get_json()
    assert "404" in document["paths"]["/api/docs/assets/{filename}"]["get"]["responses"]
