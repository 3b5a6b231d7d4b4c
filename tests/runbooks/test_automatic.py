"""An alert starts a runbook inside the evaluator's transaction; the run starts once that commits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from alerts.rules import Automatic, Condition, Rule
from alerts.states import Severity
from controlplane.auth.errors import Forbidden
from controlplane.models import AlertRecord
from controlplane.runbooks.automatic import alert_runner
from tests.runbooks.conftest import fetch


def rule(runbook: str, params: dict[str, str]) -> Rule:
    condition = Condition("error_rate", "avg", timedelta(minutes=5), ">", 0.05, ("model",))
    return Rule(
        name="high_error_rate", severity=Severity.P0, why="w", condition=condition, for_=timedelta(minutes=2),
        summary="s", runbook=runbook, runbook_params=params, automatic=Automatic(enabled=True),
    )  # fmt: skip


def alert(labels: dict[str, str]) -> AlertRecord:
    now = datetime.now(UTC)
    return AlertRecord(
        fingerprint="f" * 32, rule="high_error_rate", severity="P0", labels=labels, state="firing", summary="",
        runbook_attempts=1, updated_at=now,
    )  # fmt: skip


def test_an_alert_queues_a_run_in_its_own_transaction_and_the_sweep_starts_it(runner, sessions) -> None:
    run_automatic = alert_runner(runner)
    with sessions() as session:
        firing = alert({"model": "textcls"})
        session.add(firing)
        session.flush()  # the evaluator has written in this transaction already
        run_id = int(run_automatic(rule("danger", {"model": "{model}"}), firing))
        assert runner.sweep()["started"] == 0  # not committed yet: nothing to start
        session.commit()
    assert runner.sweep() == {"expired": 0, "started": 1}
    assert runner.wait(run_id, 60)
    run = fetch(sessions, run_id)
    assert (run.state, run.trigger, run.requested_by, run.params) == (
        "succeeded",
        "alert",
        "system",
        {"model": "textcls"},
    )
    assert run.reason == f"alert high_error_rate ({'f' * 32}) is firing"


def test_a_missing_label_or_a_runbook_not_allowed_to_run_by_itself_is_refused(runner, sessions) -> None:
    run_automatic = alert_runner(runner)
    with sessions() as session:
        firing = alert({})
        session.add(firing)
        with pytest.raises(Exception, match="must match"):
            run_automatic(rule("danger", {"model": "{model}"}), firing)  # rendered as '?'
        with pytest.raises(Forbidden, match="may not run automatically"):
            run_automatic(rule("steps", {"marker": "x"}), firing)
