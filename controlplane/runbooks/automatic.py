"""Runbooks started by alerts: the function the alert evaluator calls for a firing rule allowed to run one.

It runs inside the evaluator's transaction, so it only records the run (queued, holding its target)
in that same session; the run starts once that transaction has committed, when the runner's sweep
(`RunbookRunner.sweep`, or `launch_queued`) picks it up. The rule's `automatic` block (attempts,
cooldown) is the allowance; the runbook must also declare `"automatic": true`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy.orm import object_session

from alerts.rules import Rule
from controlplane.models import AlertRecord
from controlplane.runbooks.runner import RunbookRunner
from controlplane.runbooks.states import Trigger


def alert_runner(runner: RunbookRunner) -> Callable[[Rule, AlertRecord], str]:
    """Return the evaluator's `run_automatic`: record a run of the rule's runbook for an alert; return its id."""

    def run_automatic(rule: Rule, alert: AlertRecord) -> str:
        session = object_session(alert)
        if session is None or rule.runbook is None:
            raise ValueError(f"alert {alert.fingerprint} has no session or rule {rule.name} no runbook")
        labels = defaultdict(lambda: "?", alert.labels or {})  # a missing label fails validation, clearly
        params = {name: template.format_map(labels) for name, template in rule.runbook_params.items()}
        reason = f"alert {rule.name} ({alert.fingerprint}) is firing"
        run = runner.request(session, rule.runbook, params, None, Trigger.ALERT, reason=reason)
        return str(run.id)

    return run_automatic
