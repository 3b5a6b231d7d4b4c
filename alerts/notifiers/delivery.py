"""Send a notifier's request with http.client and judge the answer: the one module here that does I/O.

No retry loop lives here: `deliver` returns a `DeliveryResult` and the outbox decides when to try
again (after `retry_after_s` when the service said so). Redirects are not followed (a webhook
that moves is misconfigured, and following would re-post the body elsewhere, perhaps inside the
network). The destination is resolved once and checked (`targets.TargetPolicy`), and the socket
connects to the checked address. Log lines and error texts carry the masked URL only.
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import socket
import ssl
import time
from datetime import datetime
from urllib.parse import urlsplit

from alerts.notifiers.base import DeliveryResult, Notification, Notifier, Outgoing, mask_url
from alerts.notifiers.targets import PUBLIC_ONLY, TargetPolicy, TargetRefused

logger = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 64 * 1024
MAX_ERROR_CHARS = 200


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Plain HTTP to the addresses already checked, never a fresh lookup of the name."""

    def __init__(self, host: str, port: int, addresses: list[tuple[int, tuple]], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = _connect(self._addresses, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to the addresses already checked; the certificate is still verified against the URL's host name."""

    def __init__(self, host: str, port: int, addresses: list[tuple[int, tuple]], timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = self._tls.wrap_socket(_connect(self._addresses, self.timeout), server_hostname=self.host)


def _connect(addresses: list[tuple[int, tuple]], timeout: float | None) -> socket.socket:
    """Connect to the first checked address that answers."""
    error: OSError = OSError("no address to connect to")
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def send(
    outgoing: Outgoing, timeout_s: float, targets: TargetPolicy = PUBLIC_ONLY
) -> tuple[int, dict[str, str], bytes]:
    """Send the request; return status, headers and (the first 64 KiB of) the body, whatever the status.

    The host is resolved once and every address checked against `targets` (TargetRefused when one
    is internal and not allowed); the connection goes to those addresses. No proxy from the
    environment is used, and a redirect comes back as its 3xx status, never followed.
    """
    parts = urlsplit(outgoing.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the url must be http(s) with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = targets.resolve(parts.hostname, port)
    connection_class = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(parts.hostname, port, addresses, timeout_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request(outgoing.method, path, body=outgoing.body, headers=dict(outgoing.headers))
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read(MAX_ANSWER_BYTES)
    finally:
        connection.close()


def deliver(
    notifier: Notifier,
    notification: Notification,
    now: datetime,
    timeout_s: float = 10.0,
    targets: TargetPolicy = PUBLIC_ONLY,
) -> DeliveryResult:
    """Build, send and interpret one notification; network failures come back as retryable results.

    A destination `targets` refuses is a permanent failure: nothing was sent.
    """
    try:
        outgoing = notifier.build(notification, now)
    except (ValueError, TypeError, KeyError) as exc:
        result = DeliveryResult(ok=False, permanent=True, error=notifier.redact(f"cannot build the message: {exc}"))
        _log(notifier, None, result, 0.0)
        return result
    started = time.monotonic()
    status = None
    try:
        status, headers, body = send(outgoing, timeout_s, targets)
    except TargetRefused as exc:
        result = DeliveryResult(ok=False, permanent=True, error=notifier.redact(f"refused destination: {exc}"))
    except socket.gaierror as exc:
        result = DeliveryResult(ok=False, error=notifier.redact(f"network error: cannot resolve the host: {exc}"))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # NOTE: refused or unresolvable: nothing was sent. Anything else (a timeout) may have posted it.
        unsent = isinstance(exc, ConnectionRefusedError | ValueError)
        result = DeliveryResult(
            ok=False,
            error=notifier.redact(f"network error: {type(exc).__name__}: {exc}"),
            maybe_delivered=not unsent,
        )
    else:
        result = notifier.interpret(status, headers, body)
        if len(result.error) > MAX_ERROR_CHARS:  # a service's own message field, bounded like everything else
            result = dataclasses.replace(result, error=result.error[: MAX_ERROR_CHARS - 1] + "…")
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
