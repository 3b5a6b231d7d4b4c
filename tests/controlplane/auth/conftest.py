"""An app with the access blueprint, accounts made straight through the services, and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from flask import Flask
from flask.testing import FlaskClient

from controlplane.auth import api as auth_api
from controlplane.auth import tokens, users
from controlplane.auth.roles import Role
from controlplane.auth.throttle import LoginThrottle
from controlplane.models import AuditEvent

PASSWORD = "correct horse battery"


@pytest.fixture(autouse=True)
def one_small_model(app_config: dict) -> None:
    """Serve only the MLP, warmed up at the shortest bucket: access tests need a server, not models."""
    app_config.update(load_models="mlp", warmup_max_sequence=16)


@pytest.fixture
def app(app_config: dict, shared_sessions: None) -> Iterator[Flask]:
    """The app, with the access blueprint registered even where create_app does not register it yet."""
    from controlplane.app import create_app

    application = create_app(app_config)
    if "auth" not in application.blueprints:
        application.register_blueprint(auth_api.bp)
    application.testing = True
    yield application
    application.extensions["flightdeck"].shutdown(5)


@dataclass
class FakeClock:
    """A clock (seconds) the test moves by hand."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(app: Flask) -> FakeClock:
    """Install a login throttle (3 failures, then 10 s doubling) that runs on a fake clock."""
    fake = FakeClock()
    app.extensions[auth_api.THROTTLE] = LoginThrottle(
        app.extensions["flightdeck"].sessions, max_failures=3, lockout_s=10.0, clock=fake
    )
    return fake


def make_user(app: Flask, name: str, role: Role, password: str = PASSWORD) -> None:
    with app.extensions["flightdeck"].sessions() as session:
        users.create_user(session, name, password, role, datetime.now(UTC))
        session.commit()


def make_token(app: Flask, user_name: str, role: Role, ttl_s: int | None = None, now: datetime | None = None) -> str:
    """Create a token straight through the service and return its secret."""
    with app.extensions["flightdeck"].sessions() as session:
        user = users.get_user(session, user_name)
        _, secret = tokens.create_token(session, user, "test", role, now or datetime.now(UTC), ttl_s)
        session.commit()
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def login(client: FlaskClient, name: str, password: str = PASSWORD) -> str:
    """Log the client in; return the CSRF token."""
    response = client.post("/api/session", json={"name": name, "password": password})
    assert response.status_code == 200, response.get_json()
    return response.get_json()["csrf_token"]


def audit_events(app: Flask) -> list[AuditEvent]:
    """Every audit event, oldest first."""
    from sqlalchemy import select

    with app.extensions["flightdeck"].sessions() as session:
        return list(session.scalars(select(AuditEvent).order_by(AuditEvent.id)))


@pytest.fixture
def accounts(app: Flask) -> dict[str, str]:
    """An admin, an operator and a viewer; returns a token secret of each at their own role."""
    for name, role in (("ada", Role.ADMIN), ("otto", Role.OPERATOR), ("vic", Role.VIEWER)):
        make_user(app, name, role)
    return {
        name: make_token(app, name, role)
        for name, role in (("ada", Role.ADMIN), ("otto", Role.OPERATOR), ("vic", Role.VIEWER))
    }
