"""Logging set-up: plain lines for people on stderr, request lines also to HOME/logs/requests.log."""

from __future__ import annotations

import logging
import logging.handlers

from controlplane.config import Settings

_configured: set[str] = set()


def configure_logging(settings: Settings) -> None:
    """Configure the root and request loggers once per data directory."""
    key = str(settings.log_dir.resolve())
    if key in _configured:
        return
    _configured.add(key)
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    requests = logging.getLogger("flightdeck.requests")
    # NOTE: WatchedFileHandler reopens after logrotate moves the file; several workers append safely.
    file_handler = logging.handlers.WatchedFileHandler(settings.log_dir / "requests.log")
    file_handler.setFormatter(logging.Formatter("%(message)s"))
    for old in [h for h in requests.handlers if isinstance(h, logging.handlers.WatchedFileHandler)]:
        requests.removeHandler(old)
        old.close()
    requests.addHandler(file_handler)
