"""Logging through one `dictConfig`: the app, gunicorn's master and its workers all apply `logging_config`.

- The terminal (stderr) gets one line per event: text for people, or with FLIGHTDECK_LOG_FORMAT=json one
  JSON object per line (timestamp in RFC 3339 UTC, level, logger, message, request_id inside a request,
  trace_id and span_id inside a span when tracing is on: `controlplane.tracing`).
- Flightdeck's own loggers (and gunicorn's) log at FLIGHTDECK_LOG_LEVEL; everything else (APScheduler,
  urllib3, alembic, ...) at WARNING, so a library's chatter never floods the terminal.
- The sampled per-request lines go to HOME/logs/requests.log only, always JSON, written once.
"""

from __future__ import annotations

import logging
import logging.config
import os
import time
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from controlplane.config import Settings
from controlplane.requestscope import current_request
from controlplane.tracing import current_ids

REQUEST_LOGGER = "flightdeck.requests"
# Loggers that follow FLIGHTDECK_LOG_LEVEL; every other logger inherits the root's WARNING.
OWN_LOGGERS = ("controlplane", "serving", "alerts", "dashboards", "runbooks", "flightdeck")
CONSOLE = "flightdeck-console"
REQUESTS_FILE = "flightdeck-requests"


def rfc3339(created: float) -> str:
    """Return a log record's time as RFC 3339 in UTC with milliseconds: 2026-12-01T17:15:44.123Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RequestIdFilter(logging.Filter):
    """Stamp records logged while a request is handled with its id (the one echoed in X-Request-ID).

    With tracing on, records logged while a span is current get its `trace_id` and `span_id` too.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            scope = current_request()
            if scope is not None:
                record.request_id = scope.request_id
        if not hasattr(record, "trace_id"):
            ids = current_ids()
            if ids is not None:
                record.trace_id, record.span_id = ids
        return True


class TextFormatter(logging.Formatter):
    """One line for people: UTC time, level, process, logger, message, and the request id when there is one."""

    converter = time.gmtime

    def __init__(self) -> None:
        fmt = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s%(_request)s"
        super().__init__(fmt, "%Y-%m-%dT%H:%M:%SZ")

    def format(self, record: logging.LogRecord) -> str:
        # NOTE: underscored, so a JSON formatter seeing the same record never prints it as a field.
        request_id = getattr(record, "request_id", None)
        record._request = f" (request {request_id})" if request_id else ""
        return super().format(record)


class JsonLineFormatter(JsonFormatter):
    """python-json-logger's formatter, with the RFC 3339 UTC `timestamp` as the first field."""

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        fields = dict(log_data)
        log_data.clear()
        log_data["timestamp"] = rfc3339(record.created)
        log_data.update(fields)


def logging_config(settings: Settings, *, console: bool = True) -> dict[str, Any]:
    """Return the one logging configuration (`logging.config.dictConfig` form) for these settings.

    `console=False` leaves the root logger's handlers alone (a program or test harness that owns them).
    """
    level = settings.log_level
    console_formatter = "json" if settings.log_format == "json" else "text"
    config: dict[str, Any] = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {
            "text": {"()": TextFormatter},
            "json": {
                "()": JsonLineFormatter,
                "fmt": "%(levelname)s %(name)s %(message)s %(process)d",
                "rename_fields": {"levelname": "level", "name": "logger", "process": "pid"},
            },
            # The request line is its own record (a dict): only the time and level are added to it.
            "request": {"()": JsonLineFormatter, "fmt": "%(levelname)s", "rename_fields": {"levelname": "level"}},
        },
        "handlers": {
            REQUESTS_FILE: {
                # NOTE: WatchedFileHandler reopens after logrotate moves the file; several workers append
                # safely. `delay`: gunicorn's master applies this too and must not create HOME/logs early.
                "class": "logging.handlers.WatchedFileHandler",
                "filename": os.path.abspath(settings.log_dir / "requests.log"),
                "delay": True,
                "formatter": "request",
            },
        },
        "loggers": {
            **{name: {"level": level} for name in OWN_LOGGERS},
            # NOTE: not propagated: the line is for the file, and was repeated on stderr before.
            REQUEST_LOGGER: {"level": level, "handlers": [REQUESTS_FILE], "propagate": False},
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
        },
    }
    if console:
        config["handlers"][CONSOLE] = {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": console_formatter,
            "filters": ["request_id"],
        }
        config["root"] = {"level": "WARNING", "handlers": [CONSOLE]}
    return config


def configure_logging(settings: Settings) -> None:
    """Apply `logging_config`; keep the root's handlers if something other than Flightdeck installed them."""
    for folder in (settings.home, settings.log_dir):  # private, as modelstore.prepare_home makes them
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    root_handlers = logging.getLogger().handlers
    foreign = any(handler.get_name() != CONSOLE for handler in root_handlers)
    # NOTE: applying it again (each gunicorn worker after the master, each app in a test run) is idempotent.
    logging.config.dictConfig(logging_config(settings, console=not foreign))
