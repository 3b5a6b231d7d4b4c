"""Fixtures for control-plane tests: a session factory over a real migrated SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.auth import Role
from controlplane.auth import tokens as token_service
from controlplane.auth import users as user_service


def token_for(app, name: str, role: Role) -> dict[str, str]:
    """Create a user with `role` and return the Authorization header of a token of theirs."""
    with app.extensions["flightdeck"].sessions() as session:
        user = user_service.create_user(session, name, "a-long-password-1", role, datetime.now(UTC))
        _, secret = token_service.create_token(session, user, "test", role, datetime.now(UTC))
        session.commit()
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def operator(app) -> dict[str, str]:
    return token_for(app, "otto", Role.OPERATOR)


@pytest.fixture
def viewer(app) -> dict[str, str]:
    return token_for(app, "vic", Role.VIEWER)


def log_in(client, app, name: str, role: Role, password: str = "a-long-password-1") -> str:
    """Create a user with `role`, log the test client in as them; return the session's CSRF token."""
    with app.extensions["flightdeck"].sessions() as session:
        user_service.create_user(session, name, password, role, datetime.now(UTC))
        session.commit()
    response = client.post("/api/session", json={"name": name, "password": password})
    assert response.status_code == 200, response.get_json()
    return response.get_json()["csrf_token"]
