"""Open the served docs site in headless Chromium and search it; print what happened as JSON.

Run as a child process by tests/docs/test_site.py (`python -m tests.docs.browse URL CHROMIUM`), so its
Playwright never meets the session-wide one of tests/e2e in the same pytest worker.
"""

from __future__ import annotations

import json
import sys

from playwright.sync_api import sync_playwright

from tests.e2e.browser import CHROMIUM_FLAGS


def browse(url: str, chromium: str) -> dict:
    """Load the home page and an alert's page, search for 'rollback'; collect console errors."""
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(base_url=url)
        page.on("console", lambda m: errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto("/docs/")
        title = page.title()
        page.goto("/docs/alerts/high_error_rate/")
        heading = page.locator("h1").first.inner_text()
        page.keyboard.press("/")  # Material's search shortcut; its worker and index come from /docs too
        page.locator("input.md-search__input").press_sequentially("rollback", delay=20)
        page.wait_for_selector(".md-search-result__item", timeout=15000)
        results = page.locator(".md-search-result__item").count()
        browser.close()
    return {"title": title, "heading": heading, "results": results, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(browse(sys.argv[1], sys.argv[2])))
