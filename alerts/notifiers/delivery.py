"""Send a notifier's request with urllib and judge the answer: the one module here that does I/O.

No retry loop lives here: `deliver` returns a `DeliveryResult` and the outbox decides when to try
again (after `retry_after_s` when the service said so). Redirects are not followed (a webhook
that moves is misconfigured, and following would re-post the body elsewhere). Log lines and
error texts carry the masked URL only.
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request
from datetime import datetime

from alerts.notifiers.base import DeliveryResult, Notification, Notifier, Outgoing, mask_url

logger = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 64 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 - urllib's signature
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def send(outgoing: Outgoing, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
    """Send the request; return status, headers and (the first 64 KiB of) the body, whatever the status."""
    request = urllib.request.Request(
        outgoing.url, data=outgoing.body, headers=dict(outgoing.headers), method=outgoing.method
    )
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return response.status, dict(response.headers.items()), response.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as error:
        with error:
            headers = dict(error.headers.items()) if error.headers else {}
            try:
                body = error.read(MAX_ANSWER_BYTES)
            except (OSError, http.client.HTTPException, AttributeError):
                body = b""
            return error.code, headers, body


def deliver(notifier: Notifier, notification: Notification, now: datetime, timeout_s: float = 10.0) -> DeliveryResult:
    """Build, send and interpret one notification; network failures come back as retryable results."""
    try:
        outgoing = notifier.build(notification, now)
    except (ValueError, TypeError, KeyError) as exc:
        result = DeliveryResult(ok=False, permanent=True, error=notifier.redact(f"cannot build the message: {exc}"))
        _log(notifier, None, result, 0.0)
        return result
    started = time.monotonic()
    status = None
    try:
        status, headers, body = send(outgoing, timeout_s)
    except urllib.error.URLError as exc:
        result = DeliveryResult(ok=False, error=notifier.redact(f"network error: {exc.reason}"))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result = DeliveryResult(ok=False, error=notifier.redact(f"network error: {type(exc).__name__}: {exc}"))
    else:
        result = notifier.interpret(status, headers, body)
    _log(notifier, status, result, time.monotonic() - started)
    return result


def _log(notifier: Notifier, status: int | None, result: DeliveryResult, elapsed_s: float) -> None:
    outcome = "delivered" if result.ok else "failed" if result.permanent else "retry"
    level = logging.INFO if result.ok else logging.WARNING
    logger.log(
        level,
        "notify kind=%s url=%s status=%s outcome=%s retry_after_s=%s elapsed_ms=%.0f error=%s",
        notifier.kind,
        mask_url(notifier.url),
        status,
        outcome,
        result.retry_after_s,
        elapsed_s * 1000,
        result.error or "-",
    )
