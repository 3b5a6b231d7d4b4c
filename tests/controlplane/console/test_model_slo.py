"""A model's page shows its SLOs: objective, good/total, the error budget left and the burn rate per window."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from controlplane.auth import Role
from tests.controlplane.history.conftest import slot_row


def slo_row(html: str, name: str) -> str:
    return re.search(rf'<tr data-slo="{name}">.*?</tr>', html, re.S).group(0)


def cells(row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_the_model_page_shows_budget_left_and_burn_rates(app, as_role) -> None:
    now = datetime.now(UTC)
    with app.extensions["flightdeck"].sessions() as s, s.begin():
        # 10,000 requests, 5 server errors a minute ago: 0.05% bad, half the 0.1% budget, 0.5x on every window;
        # the 200 timed took 400 ms, over the 250 ms of the latency SLO: 100x its 1% budget (and enough
        # requests for every burn alert to judge: the 1x one needs 101).
        row = slot_row(now - timedelta(minutes=1), [0.4] * 200, model="mlp")
        row.successes, row.errors = 9_995, 5
        s.add(row)
    viewer, _ = as_role(Role.VIEWER)

    html = viewer.get("/models/mlp").get_data(as_text=True)

    assert 'aria-label="Service level objectives"' in html
    availability = cells(slo_row(html, "mlp_availability"))
    assert availability[:4] == ["mlp_availability", "availability 99.9% over 30d", "9995 / 10000", "50.0%"]
    assert availability[4:11] == ["0.50x"] * 7  # 5m, 30m, 1h, 2h, 6h, 1d, 3d
    assert availability[11] == "none"
    latency = cells(slo_row(html, "mlp_latency"))
    assert latency[1:4] == ["latency 99% under 250 ms over 30d", "0 / 200", "-9900.0%"]
    assert latency[4:11] == ["100.00x"] * 7
    assert latency[11].split() == ["P0", "1h/5m", "over", "14.4x", "P0", "6h/30m", "over", "6.0x",
                                   "P1", "1d/2h", "over", "3.0x", "P1", "3d/6h", "over", "1.0x"]  # fmt: skip
    assert 'href="/api/history/slos?model=mlp"' in html


def test_a_model_without_traffic_says_so_instead_of_a_full_budget(app, as_role) -> None:
    viewer, _ = as_role(Role.VIEWER)

    html = viewer.get("/models/mlp").get_data(as_text=True)

    assert cells(slo_row(html, "mlp_availability"))[2:4] == ["0 / 0", "no requests"]
