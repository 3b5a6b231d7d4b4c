"""The alerts API's request and response models (`/api/alerts`, `/api/silences`, `/api/receivers`).

Matchers, severities and receiver configs are checked by the functions the service already has
(`service.matchers_from`, the notifiers' own constructors), called from validators, so a refusal
reads as it did before the models existed. A receiver's body is one model per notifier kind,
told apart by `kind`; its secrets (webhook URL, signing secret, tokens, passwords) are write-only:
`ReceiverView` is what the notifier's `describe()` shows, never a secret.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, RootModel, field_validator, model_validator

from alerts.notifiers import NOTIFIERS, make_notifier
from alerts.rules import RuleError, parse_duration
from alerts.states import AlertState, Severity
from controlplane.alerting.service import LABEL, SEVERITIES, RouteSettings, matchers_from
from controlplane.contract import Absent, NonEmpty, QueryArgs, Reply, RequestBody, Timestamp, absent_key
from controlplane.errors import ApiError


class Matcher(RequestBody):
    """Matches an alert label's value exactly, or as a regular expression (fully matched)."""

    label: str = Field(pattern=LABEL.pattern)
    value: str
    regex: bool = False


# --- alerts -----------------------------------------------------------------------------------------


class AlertQuery(QueryArgs):
    state: AlertState | None = Field(None, description="Only alerts in this state")


class AlertView(Reply):
    """An alert: its rule, labels, state and when it changed, who acknowledged it."""

    fingerprint: str
    rule: str
    severity: Severity
    state: AlertState
    labels: dict[str, str]
    value: float | None = Field(description="the value that tripped the rule, at the last evaluation")
    summary: str
    pending_since: Timestamp | None
    firing_since: Timestamp | None
    resolved_at: Timestamp | None
    last_notified_at: Timestamp | None
    acknowledged_by: str | None
    acknowledged_at: Timestamp | None
    runbook_attempts: int = Field(description="automatic runbook runs started for it")


class TimelineEvent(Reply):
    ts: Timestamp
    kind: str = Field(
        description="state, notified, suppressed, withdrawn, acknowledged, runbook, runbook_skipped, runbook_result"
    )
    state: AlertState | None
    value: float | None
    detail: dict[str, Any]


class AlertDetail(AlertView):
    """An alert with its timeline, oldest event first."""

    timeline: list[TimelineEvent]


class AlertList(Reply):
    alerts: list[AlertView]


# --- silences ---------------------------------------------------------------------------------------


class SilenceCreate(RequestBody):
    """Mute matching alerts' notifications (never their state) for a duration or until a time."""

    matchers: list[Matcher] = Field(min_length=1, description="every matcher must match")
    comment: str = Field(description="why: shown beside the silence")
    duration: str | None = Field(None, description="how long, e.g. 30m, 2h, 1d (or give ends_at)")
    ends_at: str | None = Field(None, description="'now', a relative time like -1h, or ISO 8601")
    starts_at: str | None = Field(None, description="default now; same forms as ends_at")

    @field_validator("matchers", mode="before")
    @classmethod
    def _matchers(cls, value: Any) -> Any:
        matchers_from(value)  # its ApiError names what is wrong, as before; the model then refuses unknown keys
        return value

    @field_validator("comment")
    @classmethod
    def _comment(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("'comment' must say why (it is shown beside the silence)")
        return value.strip()

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value:
            _duration_seconds(value, "duration")
        return value

    @model_validator(mode="after")
    def _an_end(self) -> SilenceCreate:
        if not self.duration and not self.ends_at:
            raise ValueError("give 'duration' (e.g. 2h) or 'ends_at'")
        return self


class SilenceView(Reply):
    id: int
    matchers: list[Matcher]
    starts_at: Timestamp
    ends_at: Timestamp
    author: str
    comment: str
    active: bool = Field(description="whether it mutes anything now")
    expired_by: str | None = Field(description="who ended it early")


class SilenceList(Reply):
    silences: list[SilenceView]


# --- receivers --------------------------------------------------------------------------------------


class WebhookConfig(RequestBody):
    """Where a notifier posts; the URL carries the service's credentials, so it is never shown back."""

    url: NonEmpty = Field(description="https; write-only (shown masked)")
    allow_http: bool = Field(False, description="allow plain http, to a loopback host only (tests, local receivers)")


class SignedConfig(WebhookConfig):
    secret: NonEmpty | None = Field(None, description="the robot's signing secret; write-only")


class DiscordConfig(WebhookConfig):
    username: str | None = Field(None, min_length=1, max_length=80, description="the name the messages show")


class BasicAuth(RequestBody):
    username: str
    password: str = Field(description="write-only")


class AlertmanagerConfig(WebhookConfig):
    """An Alertmanager-style webhook; bearer_token or basic_auth, not both."""

    bearer_token: NonEmpty | None = Field(None, description="sent as Authorization: Bearer; write-only")
    basic_auth: BasicAuth | None = None
    max_alerts: int = Field(0, ge=0, description="alerts per message, the rest counted as truncated (0: no limit)")

    @model_validator(mode="after")
    def _one_auth(self) -> AlertmanagerConfig:
        if self.bearer_token is not None and self.basic_auth is not None:
            raise ValueError("webhook: give bearer_token or basic_auth, not both")
        return self


def _duration_seconds(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, f"'{name}'").total_seconds()
    except RuleError as exc:
        raise ApiError(str(exc)) from None


class ReceiverFields(RequestBody):
    severities: list[Severity] = Field(default_factory=lambda: list(Severity), description="default: all")
    matchers: list[Matcher] = Field(default_factory=list, description="only alerts matching all (default: every alert)")
    enabled: bool = True
    group_by: list[str] | None = Field(
        None, description="label names that split alerts into notifications (default: alertname, the rule)"
    )
    group_wait: str | None = Field(None, description="wait before a new group's first message, e.g. 30s (default)")
    group_interval: str | None = Field(None, description="wait before telling a group's changes, e.g. 5m (default)")
    repeat_interval: str | None = Field(
        None, description="repeat a group still firing, e.g. 4h (default: the server's alert_repeat_h)"
    )

    @field_validator("group_wait", "group_interval", "repeat_interval")
    @classmethod
    def _duration(cls, value: str | None, info: Any) -> str | None:
        _duration_seconds(value, info.field_name)
        return value

    def route(self) -> RouteSettings:
        """The receiver's grouping and pacing in seconds, as the service stores it."""
        return RouteSettings(
            group_by=None if self.group_by is None else tuple(self.group_by),
            group_wait_s=_duration_seconds(self.group_wait, "group_wait"),
            group_interval_s=_duration_seconds(self.group_interval, "group_interval"),
            repeat_interval_s=_duration_seconds(self.repeat_interval, "repeat_interval"),
        )

    @field_validator("severities", mode="before")
    @classmethod
    def _severities(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value or not set(value) <= set(SEVERITIES):
            raise ValueError(f"'severities' must list some of {', '.join(SEVERITIES)}")
        return value

    @field_validator("matchers", mode="before")
    @classmethod
    def _matchers(cls, value: Any) -> Any:
        if not value:
            return []
        matchers_from(value)
        return value


class SlackReceiver(ReceiverFields):
    kind: Literal["slack"]
    config: WebhookConfig


class FeishuReceiver(ReceiverFields):
    kind: Literal["feishu"]
    config: SignedConfig


class DingTalkReceiver(ReceiverFields):
    kind: Literal["dingtalk"]
    config: SignedConfig


class WeComReceiver(ReceiverFields):
    kind: Literal["wecom"]
    config: WebhookConfig


class TeamsReceiver(ReceiverFields):
    kind: Literal["teams"]
    config: WebhookConfig


class DiscordReceiver(ReceiverFields):
    kind: Literal["discord"]
    config: DiscordConfig


class AlertmanagerReceiver(ReceiverFields):
    kind: Literal["webhook"]
    config: AlertmanagerConfig


RECEIVERS: tuple[type[ReceiverFields], ...] = (
    SlackReceiver, FeishuReceiver, DingTalkReceiver, WeComReceiver, TeamsReceiver, DiscordReceiver, AlertmanagerReceiver,
)  # fmt: skip
_BY_KIND = {cls.model_fields["kind"].annotation.__args__[0]: cls for cls in RECEIVERS}  # type: ignore[union-attr]
# NOTE: a notifier added without its body model fails here, at import, not at the first PUT.
assert set(_BY_KIND) == set(NOTIFIERS), f"receiver models {sorted(_BY_KIND)} != notifiers {sorted(NOTIFIERS)}"

AnyReceiver = Annotated[
    SlackReceiver | FeishuReceiver | DingTalkReceiver | WeComReceiver | TeamsReceiver | DiscordReceiver
    | AlertmanagerReceiver,
    Field(discriminator="kind"),
]  # fmt: skip


class ReceiverPut(RootModel[AnyReceiver]):
    """A chat receiver: its kind, that notifier's config, the severities and matchers it takes."""

    @model_validator(mode="before")
    @classmethod
    def _as_the_notifier_sees_it(cls, data: Any) -> Any:
        # NOTE: the notifier checks its config first, so its refusals read as they always have;
        # the per-kind model then refuses what the notifier would have ignored (wrong types).
        if not isinstance(data, dict):
            return data
        if not isinstance(data.get("config"), dict):
            raise ApiError("'config' must be an object (url and the service's secrets)")
        kind = data.get("kind")
        try:
            make_notifier(str(kind), data["config"])
        except ValueError as exc:
            raise ApiError(f"receiver config: {exc}") from None
        allowed = _BY_KIND[kind].model_fields
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ApiError(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")
        return data


class ReceiverView(Reply):
    """A receiver as people see it: the notifier's own description, never a secret or the full URL."""

    name: str
    kind: str = Field(description="the notifier kind (a stored kind this server no longer knows comes with error)")
    severities: list[Severity]
    matchers: list[Matcher]
    enabled: bool
    group_by: list[str] = Field(description="label names that split alerts into notifications")
    group_wait: str
    group_interval: str
    repeat_interval: str | None = Field(description="null: the server's alert_repeat_h")
    url: str | Absent = absent_key("scheme and host only")
    rate_limits: list[tuple[int, float]] | Absent = absent_key(
        "the service's documented send rate: [messages, per seconds]"
    )
    signed: bool | Absent = absent_key("feishu, dingtalk: whether a secret signs")
    auth: Literal["none", "bearer", "basic"] | Absent = absent_key("webhook only")
    max_alerts: int | Absent = absent_key("webhook only")
    error: str | Absent = absent_key("why the stored config is unusable")


class ReceiverList(Reply):
    receivers: list[ReceiverView]


class TestResult(Reply):
    """What the chat service answered to the test message."""

    __test__ = False  # not a pytest class

    ok: bool
    error: str = Field(description="empty when delivered; secrets redacted")
    retry_after_s: float | None


# --- notifications (the outbox) -------------------------------------------------------------------

NotificationState = Literal["pending", "sent", "failed", "superseded", "withdrawn"]
MAX_NOTIFICATIONS = 1000


class NotificationQuery(QueryArgs):
    """Filters over the outbox, newest first."""

    state: NotificationState | None = Field(None, description="only messages in this delivery state")
    receiver: str | None = Field(None, description="only messages to this receiver")
    limit: int = Field(100, ge=1, le=MAX_NOTIFICATIONS, description="at most this many messages")


class NotificationView(Reply):
    """One outbox message: a group's notification to one receiver, and how its delivery stands."""

    id: int
    receiver: str
    group_key: str = Field(description="Alertmanager's form: route key, then the group's labels")
    status: Literal["firing", "resolved"] = Field(description="firing while any alert of the group fires")
    state: NotificationState = Field(
        description="superseded: a newer message for the group replaced it unsent; withdrawn: its alerts were all "
        "silenced or inhibited before it could be delivered"
    )
    attempts: int = Field(description="delivery attempts so far")
    next_attempt_at: Timestamp | None = Field(description="when it is tried next (pending only)")
    last_error: str = Field(description="the last attempt's error, secrets redacted; empty once sent")
    created_at: Timestamp
    sent_at: Timestamp | None
    alerts: list[str] = Field(description="fingerprints of the alerts it carries")


class NotificationList(Reply):
    notifications: list[NotificationView]
