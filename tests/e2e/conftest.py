"""End-to-end fixtures: one headless Chromium for the e2e package, shared by every browser test module."""

# NOTE: defined here once; a module importing the fixture itself would start a second Playwright, which refuses.
from tests.e2e.browser import browser  # noqa: F401

__all__ = ["browser"]
