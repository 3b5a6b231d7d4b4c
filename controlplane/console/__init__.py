"""The web console: server-rendered pages for on-call engineers (see `controlplane.console.base`)."""

from controlplane.console import admin_pages, alert_pages, model_pages, registry_pages, runbook_pages, session_pages
from controlplane.console.base import bp, login_required

__all__ = [
    "admin_pages",
    "alert_pages",
    "bp",
    "login_required",
    "model_pages",
    "registry_pages",
    "runbook_pages",
    "session_pages",
]
