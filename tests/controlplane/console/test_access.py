"""Getting into the console and out again: login form, redirects, CSRF, throttling, cookie flags, headers."""

from __future__ import annotations

import re

import pytest

from controlplane.auth import Role
from controlplane.auth.throttle import THROTTLE, LoginThrottle
from controlplane.models import AuditEvent
from tests.controlplane.conftest import log_in
from tests.controlplane.console.conftest import form_csrf

PAGES = [
    "/",
    "/models",
    "/models/mlp",
    "/dashboards",
    "/alerts",
    "/runbooks",
    "/runbooks/diagnostics",
    "/audit",
    "/settings",
]


def login_form(client, name: str, password: str, next_path: str = "", csrf: str | None = None):
    token = csrf if csrf is not None else form_csrf(client.get("/login").get_data(as_text=True))
    return client.post("/login", data={"name": name, "password": password, "csrf_token": token, "next": next_path})


@pytest.mark.parametrize("path", PAGES)
def test_every_page_sends_a_stranger_to_the_login_form_and_back(app, client, path) -> None:
    log_in(app.test_client(), app, "ada", Role.VIEWER)  # the user exists; this client is not logged in

    refused = client.get(path)
    assert refused.status_code == 302
    assert refused.headers["Location"] == f"/login?next={path}"
    arrived = login_form(client, "ada", "a-long-password-1", path)
    assert arrived.status_code == 302 and arrived.headers["Location"] == path
    assert client.get(path).status_code == 200


@pytest.mark.parametrize(
    "target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", ""]
)
def test_the_login_form_never_sends_anyone_off_the_site(app, client, target) -> None:
    log_in(app.test_client(), app, "ada", Role.VIEWER)
    response = login_form(client, "ada", "a-long-password-1", target)
    assert response.status_code == 302 and response.headers["Location"] == "/"


def test_the_login_form_needs_its_csrf_token(app, client) -> None:
    log_in(app.test_client(), app, "ada", Role.VIEWER)
    client.get("/login")  # the visitor has a session with a token, but the form does not send it
    response = login_form(client, "ada", "a-long-password-1", csrf="forged")
    assert response.status_code == 400 and "The form expired" in response.get_data(as_text=True)
    assert client.get("/").status_code == 302  # not logged in


def test_a_wrong_password_is_refused_and_repeated_failures_lock_the_form(app, client) -> None:
    app.extensions[THROTTLE] = LoginThrottle(app.extensions["flightdeck"].sessions, max_failures=2, lockout_s=30)
    log_in(app.test_client(), app, "ada", Role.VIEWER)

    for _ in range(2):
        wrong = login_form(client, "ada", "not-the-password")
        assert wrong.status_code == 401 and "Wrong name or password." in wrong.get_data(as_text=True)
        assert 'value="ada"' in wrong.get_data(as_text=True)  # the name stays filled in
    locked = login_form(client, "ada", "a-long-password-1")  # even the right password waits
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) == 30
    assert "too many failed logins" in locked.get_data(as_text=True)
    assert client.get("/").status_code == 302
    with app.extensions["flightdeck"].sessions() as db:
        denied = [e.detail.get("reason") for e in db.query(AuditEvent).filter_by(action="auth.login", outcome="denied")]
    assert denied == ["bad_credentials", "bad_credentials", "throttled"]


def test_logout_needs_the_form_token_and_then_ends_the_session(app, client) -> None:
    log_in(client, app, "ada", Role.VIEWER)
    page = client.get("/").get_data(as_text=True)

    assert client.post("/logout", data={"csrf_token": "forged"}).status_code == 400
    assert client.get("/").status_code == 200  # still logged in
    out = client.post("/logout", data={"csrf_token": form_csrf(page)})
    assert out.status_code == 302 and out.headers["Location"] == "/login"
    assert client.get("/").status_code == 302


@pytest.mark.parametrize(
    ("mode", "base_url", "secure"),
    [("auto", "http://localhost", False), ("auto", "https://localhost", True), ("always", "http://localhost", True),
     ("never", "https://localhost", False)],
)  # fmt: skip
def test_the_session_cookie_is_httponly_lax_and_secure_when_it_should_be(app_config, mode, base_url, secure) -> None:
    from controlplane.app import create_app

    app = create_app(app_config | {"cookie_secure": mode})
    try:
        client = app.test_client()
        log_in(app.test_client(), app, "ada", Role.VIEWER)
        token = form_csrf(client.get("/login", base_url=base_url).get_data(as_text=True))
        response = client.post(
            "/login", base_url=base_url, data={"name": "ada", "password": "a-long-password-1", "csrf_token": token}
        )
        cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
        assert ("Secure" in cookie) is secure
    finally:
        app.extensions["flightdeck"].shutdown(5)


def test_a_bad_cookie_secure_setting_is_refused() -> None:
    from controlplane.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="COOKIE_SECURE must be one of"):
        load_settings({"FLIGHTDECK_COOKIE_SECURE": "sometimes"})


@pytest.mark.parametrize("path", [*PAGES, "/login"])
def test_pages_load_nothing_from_elsewhere_and_run_no_inline_script(app, as_role, path) -> None:
    client = as_role(Role.ADMIN)[0] if path != "/login" else app.test_client()
    response = client.get(path)
    html = response.get_data(as_text=True)

    assert response.status_code == 200
    csp = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "form-action 'self'" in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Cache-Control"] == "no-store"
    for ref in re.findall(r'\s(?:src|href|action|data-api|data-figures)="([^"]*)"', html):
        assert ref.startswith("/") and not ref.startswith("//"), ref
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "no inline scripts"
    assert not re.search(r"\son[a-z]+=", html), "no inline event handlers"


def test_a_login_lasts_session_hours_and_then_the_console_asks_again(app, client, monkeypatch) -> None:
    from itsdangerous import TimestampSigner

    log_in(client, app, "ada", Role.VIEWER)
    assert client.get("/").status_code == 200
    cookie = client.get_cookie("session")
    data = app.session_interface.get_signing_serializer(app).loads(cookie.value)
    hours = app.extensions["flightdeck"].settings.session_hours
    assert app.permanent_session_lifetime.total_seconds() == hours * 3600

    signed_at = TimestampSigner.get_timestamp(TimestampSigner("k")) - int(hours * 3600) - 60
    monkeypatch.setattr(TimestampSigner, "get_timestamp", lambda self: signed_at)
    stale = app.session_interface.get_signing_serializer(app).dumps(data)  # the same login, signed too long ago
    monkeypatch.undo()
    client.set_cookie("session", stale)
    assert client.get("/").status_code == 302
    client.set_cookie("session", cookie.value)
    assert client.get("/").status_code == 200
