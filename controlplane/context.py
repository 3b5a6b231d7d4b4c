"""The one way a request handler reaches the process's services: `current_services()`.

`create_app` puts the `Services` the composition root built under `app.extensions[KEY]`; nothing
else reads that key. Kept apart from `services.py` so views and guards import it without pulling
in the engine, the scheduler and the alert evaluator (and without import cycles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask, current_app

if TYPE_CHECKING:
    from controlplane.services import Services

KEY = "flightdeck"


def current_services() -> Services:
    """Return the services of the application handling the current request."""
    return current_app.extensions[KEY]


def app_services(app: Flask) -> Services:
    """Return the services of `app` (for blueprint setup, outside a request)."""
    return app.extensions[KEY]
