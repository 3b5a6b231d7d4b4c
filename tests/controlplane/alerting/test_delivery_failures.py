"""webhook_deliveries_failing counts failed attempts: one message retried eight times is eight, not one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.alerting.observe import observe
from controlplane.models import OutboxMessage
from controlplane.windowjobs import load_alert_rules


def failing_rule(app):
    rules, _ = load_alert_rules(app.extensions["flightdeck"].settings)
    return next(r for r in rules if r.name == "webhook_deliveries_failing")


def message(now: datetime, *, state: str, attempts: int, error: str, age: timedelta) -> OutboxMessage:
    return OutboxMessage(
        receiver="chat", group_key="{}:{}", status="firing", payload={}, state=state, attempts=attempts,
        next_attempt_at=now, last_error=error, created_at=now - age, sent_at=None,
    )  # fmt: skip


def test_failed_attempts_are_counted_not_messages(app) -> None:
    rule = failing_rule(app)
    now = datetime.now(UTC)
    with app.extensions["flightdeck"].sessions() as session:
        session.add_all(
            [
                message(now, state="pending", attempts=8, error="HTTP 500", age=timedelta(hours=2)),  # still retrying
                message(
                    now, state="sent", attempts=3, error="HTTP 429", age=timedelta(minutes=1)
                ),  # 2 failed, then sent
                message(now, state="sent", attempts=1, error="", age=timedelta(minutes=1)),  # clean
                message(
                    now, state="failed", attempts=4, error="HTTP 400", age=timedelta(hours=2)
                ),  # outside the window
            ]
        )
        session.commit()
        values = observe(session, rule, now, engine_ready=lambda: True, max_queue_size=128)
    assert values == {(): 10.0}
    assert rule.condition.holds(values[()])  # over the rule's threshold of 3: the alert would fire
