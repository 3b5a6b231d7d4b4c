"""The console's help links and the alerts' messages point at the bundled docs site's pages (/docs)."""

from __future__ import annotations

from datetime import UTC, datetime

from alerts.notifiers import render
from alerts.notifiers.base import Alert
from controlplane.auth.roles import Role


def test_every_console_page_links_the_docs_and_the_alert_rules_link_their_pages(as_role) -> None:
    client, _ = as_role(Role.VIEWER)
    overview = client.get("/").get_data(as_text=True)
    assert 'href="/docs/"' in overview
    alerts = client.get("/alerts").get_data(as_text=True)
    assert 'href="/docs/alerts/high_error_rate/"' in alerts
    runbook = client.get("/runbooks/rollback").get_data(as_text=True)
    assert 'href="/docs/runbooks/rollback/"' in runbook


def test_an_alert_message_links_the_rule_page_beside_the_console_and_the_runbook() -> None:
    alert = Alert(
        fingerprint="f" * 32, name="high_error_rate", severity="P0", status="firing", starts_at=datetime.now(UTC),
        console_url="https://fd.example/alerts/ff", runbook_url="https://fd.example/runbooks/rollback",
        docs_url="https://fd.example/docs/alerts/high_error_rate/",
    )  # fmt: skip
    assert render.links(alert)[-1] == ("https://fd.example/docs/alerts/high_error_rate/", "What it means")
    assert "https://fd.example/docs/alerts/high_error_rate/" not in repr(
        render.links(Alert(**{**alert.__dict__, "docs_url": ""}))
    )
