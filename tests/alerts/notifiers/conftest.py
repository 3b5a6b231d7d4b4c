"""Fixtures for notifier tests: a firing and a resolved notification."""

from __future__ import annotations

import pytest

from alerts.notifiers import Notification
from tests.alerts.notifiers.samples import make_notification, resolved_alert


@pytest.fixture
def firing() -> Notification:
    return make_notification()


@pytest.fixture
def resolved() -> Notification:
    return make_notification(resolved_alert())
