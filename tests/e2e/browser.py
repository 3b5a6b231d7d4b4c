"""Headless Chromium for the console's end-to-end tests: the system browser driven by Playwright.

The browser is Debian's `chromium` (installed by .ci/run); Playwright only drives it, so no browser is
downloaded. Every page a test opens records its console errors and uncaught exceptions; the test's
teardown fails on any it did not expect, and saves a screenshot of each page to ARTIFACTS.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FLIGHTDECK_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--metrics-recording-only", "--mute-audio",
]  # fmt: skip


def chromium_path() -> str | None:
    """Return the system Chromium, or None (the tests skip, unless FLIGHTDECK_REQUIRE_BROWSER is set)."""
    for candidate in (os.environ.get("FLIGHTDECK_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def require_browser() -> str:
    found = chromium_path()
    if found is None:
        if os.environ.get("FLIGHTDECK_REQUIRE_BROWSER"):
            pytest.fail("FLIGHTDECK_REQUIRE_BROWSER is set but no Chromium was found (apt install chromium)")
        pytest.skip("no system Chromium (apt install chromium chromium-driver)")
    return found


@dataclass
class PageLog:
    """What a page said on its console: errors and uncaught exceptions."""

    errors: list[str] = field(default_factory=list)
    expected: list[re.Pattern] = field(default_factory=list)

    def expect(self, pattern: str) -> None:
        """Allow console errors matching `pattern` (a test that provokes a refusal on purpose)."""
        self.expected.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.expected)]


@pytest.fixture(scope="package")
def browser() -> Iterator:
    """One headless Chromium for the e2e package's tests (which xdist runs on one worker, in a row).

    NOTE: package, not session: Playwright's sync API keeps an asyncio loop running in this thread while it
    is open, and `asyncio.run` refuses to start under it. Open for the whole session, it failed the tests
    that call `asyncio.run` (test_grpc's, test_idle_wakeups') whenever xdist gave them this worker after it.
    """
    executable = require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


def screenshot_name(request: pytest.FixtureRequest, label: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{request.node.name}-{label}")
    return ARTIFACTS / f"{safe}.png"


def open_console(browser, url: str, user: str, password: str, width: int = 1280, height: int = 900):
    """Log `user` in through the console's form in a fresh context; return (context, page, log)."""
    context = browser.new_context(viewport={"width": width, "height": height}, base_url=url)
    page = context.new_page()
    log = PageLog()
    page.on("console", lambda m: log.errors.append(f"{m.text} @ {page.url}") if m.type == "error" else None)
    page.on("pageerror", lambda exc: log.errors.append(f"uncaught: {exc} @ {page.url}"))
    page.goto("/login")
    page.fill("input[name=name]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))
    return context, page, log
