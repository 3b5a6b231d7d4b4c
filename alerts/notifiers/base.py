"""What every chat notifier shares: the alert data it is given, the request it returns, the verdict.

A notifier is pure: `build` turns a `Notification` into an `Outgoing` request (no network), and
`interpret` turns the service's answer into a `DeliveryResult`. `delivery.deliver` does the I/O.
Secrets (webhook URLs, signing keys, tokens) stay inside the notifier: `describe()`, `repr()` and
every error text show a masked form only.
"""

from __future__ import annotations

import abc
import email.utils
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

from alerts.states import Severity

STATUSES = ("firing", "resolved")
LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}
ERROR_CODE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # an answer kept in an error text: a code such as Slack's


@dataclass(frozen=True)
class Alert:
    """One alert as a notifier sees it; `annotations["summary"]` is the one-line headline."""

    fingerprint: str
    name: str
    severity: Severity
    status: str
    starts_at: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    value: float | None = None
    value_text: str = ""
    ends_at: datetime | None = None
    runbook_url: str = ""
    runbook_command: str = ""
    console_url: str = ""
    docs_url: str = ""  # the rule's page in the bundled docs site: what it means, what to check

    def __post_init__(self) -> None:
        object.__setattr__(self, "severity", Severity(self.severity))
        if self.status not in STATUSES:
            raise ValueError(f"alert status must be one of {STATUSES}, not {self.status!r}")

    @property
    def summary(self) -> str:
        """The headline: the `summary` annotation, else the alert's name."""
        return self.annotations.get("summary") or self.name

    @property
    def shown_value(self) -> str:
        """The value that tripped the alert, as people should read it."""
        if self.value_text:
            return self.value_text
        return "n/a" if self.value is None else f"{self.value:g}"


@dataclass(frozen=True)
class Notification:
    """One group of alerts for one receiver; `status` is firing when any alert fires."""

    receiver: str
    group_key: str
    status: str
    alerts: Sequence[Alert]
    group_labels: Mapping[str, str] = field(default_factory=dict)
    common_labels: Mapping[str, str] = field(default_factory=dict)
    common_annotations: Mapping[str, str] = field(default_factory=dict)
    external_url: str = ""
    key: str = ""  # idempotency key: the same for every retry of one message, sent where the service takes one

    def __post_init__(self) -> None:
        if not self.alerts:
            raise ValueError("a notification needs at least one alert")
        expected = "firing" if any(a.status == "firing" for a in self.alerts) else "resolved"
        if self.status != expected:
            raise ValueError(f"notification status is {self.status!r} but its alerts make it {expected!r}")


@dataclass(frozen=True)
class Outgoing:
    """The HTTP request a notifier wants sent. Its repr hides the URL's secrets and the body."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes

    def __repr__(self) -> str:
        return f"Outgoing({self.method} {mask_url(self.url)}, {len(self.body)} bytes)"


@dataclass(frozen=True)
class DeliveryResult:
    """The verdict on one attempt: delivered, retry (after `retry_after_s` if known), or give up.

    `maybe_delivered` marks a failure whose answer was lost (a timeout, a dropped connection):
    the service may have posted the message all the same.
    """

    ok: bool
    retry_after_s: float | None = None
    permanent: bool = False
    error: str = ""
    maybe_delivered: bool = False


def mask_url(url: str) -> str:
    """Keep scheme and host; webhook paths and queries carry the credentials."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/***"


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Read Retry-After as delay-seconds or an HTTP-date (RFC 9110); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def header(headers: Mapping[str, str], name: str) -> str | None:
    """Look a header up case-insensitively."""
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


class Notifier(abc.ABC):
    """A chat service's adapter: validates its config, builds requests, reads answers.

    Subclasses set `kind`, list their extra config keys in `options` (secret ones also in
    `secret_options`), state the service's documented send rate as `rate_limits` (so an outbox
    can pace itself: `((20, 60.0),)` is 20 messages a minute), and implement `build`.
    Example config::

        {"url": "https://hooks.slack.com/services/T0/B0/XXXX"}
        {"url": "http://127.0.0.1:8080/hook", "allow_http": True}   # tests only, loopback only
    """

    kind: ClassVar[str]
    options: ClassVar[frozenset[str]] = frozenset()
    secret_options: ClassVar[frozenset[str]] = frozenset()
    rate_limits: ClassVar[tuple[tuple[int, float], ...]] = ()  # (messages, per seconds); () = none documented

    def __init__(self, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise ValueError(f"{self.kind}: config must be a mapping")
        unknown = set(config) - {"url", "allow_http"} - self.options
        if unknown:
            raise ValueError(f"{self.kind}: unknown config keys {sorted(unknown)}")
        url = config.get("url")
        if not isinstance(url, str) or not url.strip():
            raise ValueError(f"{self.kind}: config needs a webhook 'url'")
        url = url.strip()
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError:
            raise ValueError(f"{self.kind}: the webhook url is malformed") from None
        if not parts.hostname:
            raise ValueError(f"{self.kind}: the webhook url has no host")
        if parts.scheme != "https":
            loopback_http = parts.scheme == "http" and config.get("allow_http") is True
            if not loopback_http or parts.hostname not in LOOPBACK_HOSTS:
                raise ValueError(f"{self.kind}: the webhook url must use https (http only with allow_http on loopback)")
        self.url = url
        self._secrets = [url, *_url_tokens(url)]
        for key in self.secret_options:
            secret = config.get(key)
            if isinstance(secret, str) and secret:
                self._secrets.append(secret)

    @abc.abstractmethod
    def build(self, notification: Notification, now: datetime) -> Outgoing:
        """Return the request that delivers `notification`; `now` dates signatures."""

    def interpret(self, status: int, headers: Mapping[str, str], body: bytes) -> DeliveryResult:
        """Judge an answer: 2xx delivered; 408, 429 and 5xx retry (honouring Retry-After); else give up."""
        if 200 <= status < 300:
            return DeliveryResult(ok=True)
        error = self.redact(f"HTTP {status}: {snippet(body)}".rstrip(": "))
        if status in (408, 429) or status >= 500:
            return DeliveryResult(
                ok=False, retry_after_s=parse_retry_after(header(headers, "Retry-After")), error=error
            )
        return DeliveryResult(ok=False, permanent=True, error=error)

    def describe(self) -> dict[str, Any]:
        """Say what this notifier is, for people: never a secret, never the full URL."""
        return {"kind": self.kind, "url": mask_url(self.url), "rate_limits": [list(r) for r in self.rate_limits]}

    def redact(self, text: str) -> str:
        """Replace every secret this notifier knows, and any URL's path and query, in `text`."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return re.sub(r"\b(https?)://([^/\s'\"<>]+)[^\s'\"<>]*", r"\1://\2/***", text)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    def _json_body(self, status: int, headers: Mapping[str, str], body: bytes) -> tuple[dict | None, DeliveryResult]:
        """Parse a JSON answer; the result is the default verdict when it is not a 2xx JSON object."""
        verdict = Notifier.interpret(self, status, headers, body)
        if not verdict.ok:
            return None, verdict
        try:
            document = json.loads(body.decode("utf-8"))
        except ValueError:
            document = None
        if not isinstance(document, dict):
            return None, DeliveryResult(ok=False, error=self.redact(f"HTTP {status}: unreadable answer"))
        return document, verdict


def snippet(body: bytes) -> str:
    """The service's error code: a JSON answer's code field, or an answer that is only a code; else nothing.

    Slack answers `invalid_token`, Teams `{"error": {"code": "TriggerInputSchemaMismatch"}}`.
    NOTE: never the body itself: an error text reaches `/test`'s caller and the outbox listing, and
    echoing what a destination answered would let anyone who can set a receiver read other services.
    """
    text = body[:4096].decode("utf-8", "replace").strip()
    if ERROR_CODE.match(text):
        return text
    try:
        document = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(document, dict):
        return ""
    error = document.get("error")
    nested = error if isinstance(error, dict) else {}
    for value in (nested.get("code"), error, document.get("code"), document.get("errcode"), document.get("error_code")):
        if isinstance(value, str | int) and not isinstance(value, bool) and ERROR_CODE.match(str(value)):
            return str(value)
    return ""


def _url_tokens(url: str) -> list[str]:
    """Path segments and query values that look like credentials (ids, tokens, keys, signatures)."""
    parts = urlsplit(url)
    raw_values = [pair.partition("=")[2] for pair in parts.query.split("&")]  # as sent, percent-encoded
    candidates = [*parts.path.split("/"), *raw_values, *(value for _, value in parse_qsl(parts.query))]
    return [c for c in candidates if len(c) >= 16 or (len(c) >= 6 and any(ch.isdigit() for ch in c))]
