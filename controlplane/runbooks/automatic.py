"""Runbooks started by alerts: the function the alert evaluator calls for a firing rule allowed to run one.

It runs inside the evaluator's transaction, so it only records the run (queued, holding its target)
in that same session; the run starts once that transaction has committed, when the runner's sweep
(`RunbookRunner.sweep`, or `launch_queued`) picks it up. The rule's `automatic` block (attempts,
cooldown) is the allowance; the runbook must also declare `"automatic": true`.

Scope: remediation acts on a target (a model, else the engine), so its limits are per runbook and
target, not per alert. Sibling alerts on one model (two versions failing, or two rules naming the
same runbook) share them: while a run acts on the target no other is asked for, and after a run of
the runbook on that target began, the next waits for the rule's cooldown. Both are `Skipped`,
before the runner is asked, so it never has to refuse one with a 409.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from alerts.rules import Rule, duration_text
from controlplane.clock import utcnow
from controlplane.models import AlertRecord
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.runner import RunbookRunner
from controlplane.runbooks.states import RunState, Trigger

# Runs that never acted and never will: they start no cooldown.
NEVER_ACTED = (RunState.AWAITING_APPROVAL.value, RunState.REJECTED.value, RunState.EXPIRED.value)


class Skipped(Exception):
    """An automatic run not asked for now; `why` says so and `blocker` names the run in the way.

    The evaluator records it on the alert's timeline once per blocker, not once per evaluation.
    """

    def __init__(self, why: str, blocker: str) -> None:
        super().__init__(why)
        self.why = why
        self.blocker = blocker


def last_run(session: Session, runbook: str, target: str, since: datetime) -> RunbookRun | None:
    """Return the newest run of `runbook` on `target` requested after `since` that acted or may act."""
    return session.scalars(
        select(RunbookRun)
        .where(
            RunbookRun.runbook == runbook,
            RunbookRun.target == target,
            RunbookRun.dry_run.is_(False),
            RunbookRun.requested_at > since,
            RunbookRun.state.not_in(NEVER_ACTED),
        )
        .order_by(RunbookRun.requested_at.desc())
        .limit(1)
    ).first()


def alert_runner(runner: RunbookRunner, clock: Callable[[], datetime] = utcnow) -> Callable[[Rule, AlertRecord], str]:
    """Return the evaluator's `run_automatic`: record a run of the rule's runbook for an alert; return its id.

    Raises `Skipped` while another run acts on the target or within the cooldown of the last run of
    this runbook on it (whoever asked for that one: an alert or a person).
    """

    def run_automatic(rule: Rule, alert: AlertRecord) -> str:
        session = object_session(alert)
        if session is None or rule.runbook is None:
            raise ValueError(f"alert {alert.fingerprint} has no session or rule {rule.name} no runbook")
        labels = defaultdict(lambda: "?", alert.labels or {})  # a missing label fails validation, clearly
        params = {name: template.format_map(labels) for name, template in rule.runbook_params.items()}
        runbook = runner.catalog.get(rule.runbook)
        target = runbook.target(runbook.validate(params))
        holder = runner.holder(session, target)
        if holder is not None:
            why = f"run {holder.id} ({holder.runbook}, {holder.state}) is acting on {target}"
            raise Skipped(why, f"acting:{holder.id}")
        cooldown = rule.automatic.cooldown
        recent = last_run(session, rule.runbook, target, clock() - cooldown)
        if recent is not None:
            why = f"run {recent.id} of {recent.runbook} on {target} began less than {duration_text(cooldown)} ago"
            why += " (its cooldown)"
            raise Skipped(why, f"cooldown:{recent.id}")
        reason = f"alert {rule.name} ({alert.fingerprint}) is firing"
        run = runner.request(session, rule.runbook, params, None, Trigger.ALERT, reason=reason)
        return str(run.id)

    return run_automatic
