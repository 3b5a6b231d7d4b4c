"""The runner: registered scripts as subprocesses without a shell, one run per target, two-person rule, resume."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from controlplane.auth.errors import Forbidden
from controlplane.auth.users import get_user
from controlplane.errors import Conflict, NotFound
from controlplane.models import ApiToken, AuditEvent
from controlplane.runbooks.declaration import BadArguments
from controlplane.runbooks.process import MAX_OUTPUT_BYTES
from controlplane.runbooks.states import Trigger
from tests.runbooks.conftest import fetch, start

WAIT_S = 60  # an upper bound for a run to be recorded as finished; runs end on events, not on this


def finished(runner, sessions, run_id: int):
    assert runner.wait(run_id, WAIT_S), f"run {run_id} did not finish"
    return fetch(sessions, run_id)


def open_gate(gate: Path, word: str = "go") -> None:
    with gate.open("w") as pipe:  # blocks until the runbook has opened its end: the run is surely running
        pipe.write(word)


def events(sessions) -> list[AuditEvent]:
    with sessions() as session:
        return list(session.scalars(select(AuditEvent).order_by(AuditEvent.id)))


def test_output_and_steps_are_stored_and_arguments_arrive_literally(runner, sessions, people, runbooks_dir) -> None:
    canary = runbooks_dir / "canary"  # scripts run in the runbooks folder (the runner's cwd here)
    text = "a; touch canary $(touch canary) `touch canary` | cat && echo > canary"
    run_id = start(runner, sessions, "echo", {"text": text}, people["otto"])
    run = finished(runner, sessions, run_id)
    assert run.state == "succeeded" and run.exit_code == 0 and run.error == ""
    [step] = run.steps
    assert step["step"] == "echo" and step["status"] == "ok"
    assert step["detail"]["text"] == text and step["detail"]["argv"] == [f"--text={text}", "--repeat=1"]
    assert not canary.exists()  # no shell ever saw the words
    assert '"step": "echo"' in run.output
    # A minimal environment: the server's own variables (its secret key, database URL) never reach a script.
    assert step["detail"]["env"] == sorted(
        ["PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "FLIGHTDECK_URL", "FLIGHTDECK_OUTPUT_DIR",
         "FLIGHTDECK_RUNBOOK_RUN", "FLIGHTDECK_TOKEN"]
    )  # fmt: skip
    assert step["detail"]["has_token"] is True


def test_each_run_gets_a_short_lived_token_scoped_to_the_runbook_and_revoked_at_its_end(
    runner, sessions, people, clock
) -> None:
    run = finished(runner, sessions, start(runner, sessions, "echo", {"text": "hi"}, people["otto"]))
    with sessions() as session:
        token = session.get(ApiToken, run.token_id)
        assert token.name == f"runbook-{run.id}" and token.user_id == people["otto"].user_id
        assert token.role == "viewer"  # echo declares viewer; otto is an operator: the token gets the least
        assert (token.expires_at - token.created_at).total_seconds() == 30 + 60  # timeout + margin
        assert token.revoked_at is not None


def test_refused_arguments_record_nothing_and_start_nothing(runner, sessions, people) -> None:
    for name, params, error in [
        ("rollback", {"model": "textcls; rm -rf /"}, BadArguments),
        ("rollback", {"model": "-x"}, BadArguments),
        ("rollback", {"model": "textcls", "force": True}, BadArguments),
        ("../runbooks/echo", {"text": "x"}, NotFound),
        ("_runbook", {}, NotFound),
    ]:
        with sessions() as session, pytest.raises(error):
            runner.request(session, name, params, people["otto"], Trigger.PERSON)
    with sessions() as session:
        assert runner.list_runs(session) == []


def test_output_is_capped(runner, sessions, people) -> None:
    run = finished(
        runner, sessions, start(runner, sessions, "echo", {"text": "x" * 99, "repeat": 5000}, people["otto"])
    )
    assert run.state == "succeeded"
    assert len(run.output.encode()) < MAX_OUTPUT_BYTES + 100
    assert run.output.endswith("bytes of output were not kept]\n")


def test_a_run_past_its_timeout_is_killed(runner, sessions, people, gate) -> None:
    run = finished(runner, sessions, start(runner, sessions, "stuck", {"gate": str(gate)}, people["otto"]))
    assert run.state == "timed_out" and run.error == "killed at the runbook's timeout (1 s)"
    assert [(s["step"], s["status"]) for s in run.steps] == [("started", "ok")]
    with sessions() as session:
        assert session.get(ApiToken, run.token_id).revoked_at is not None
        assert session.get(type(run), run.id).active_target is None


def test_one_run_at_a_time_per_target(runner, sessions, people, gate, tmp_path) -> None:
    first = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["otto"])
    assert fetch(sessions, first).state == "running"
    with sessions() as session, pytest.raises(Conflict, match=f"run {first} .* is acting on model:textcls"):
        runner.request(session, "hold", {"model": "textcls", "gate": str(gate)}, people["olga"], Trigger.PERSON)
    with sessions() as session, pytest.raises(Conflict):
        runner.request(session, "danger", {"model": "textcls"}, None, Trigger.ALERT)  # alerts wait their turn too
    # Another target is free, and a dry run changes nothing, so it neither waits nor blocks.
    other_gate = tmp_path / "other"
    __import__("os").mkfifo(other_gate)
    other = start(runner, sessions, "hold", {"model": "mlp", "gate": str(other_gate)}, people["olga"])
    dry = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["olga"], dry_run=True)
    assert finished(runner, sessions, dry).state == "succeeded"
    open_gate(gate)
    open_gate(other_gate, "again")
    assert finished(runner, sessions, first).steps[0]["detail"] == "gate said go"
    assert finished(runner, sessions, other).state == "succeeded"
    again = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["olga"])
    open_gate(gate)
    assert finished(runner, sessions, again).state == "succeeded"


def test_a_run_whose_supervisor_vanished_releases_its_target_after_its_deadline(
    runner, sessions, people, gate, clock
) -> None:
    first = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["otto"])
    clock.advance(60 + 60 + 1)  # hold's timeout and the margin: as if its process had died
    with sessions() as session:
        second = runner.request(session, "echo", {"text": "x"}, people["olga"], Trigger.PERSON)
        hold_again = runner.request(
            session, "hold", {"model": "textcls", "gate": "/nonexistent"}, people["olga"], Trigger.PERSON
        )
        session.commit()
    lost = fetch(sessions, first)
    assert lost.state == "failed" and lost.error.startswith("lost:") and second.state == hold_again.state == "queued"
    open_gate(gate)  # the old process does end after all; its record stays 'lost'
    assert finished(runner, sessions, first).state == "failed"


def test_a_dangerous_run_waits_for_a_different_operator(runner, sessions, people) -> None:
    with sessions() as session:
        run = runner.request(session, "danger", {"model": "textcls"}, people["otto"], Trigger.CONSOLE)
        session.commit()
    assert run.state == "awaiting_approval" and run.active_target is None
    assert runner.launch(run.id) is False  # nothing starts before the approval
    for who, refusal in (("otto", "two-person rule: otto asked for run"), ("vic", "needs the operator role")):
        with sessions() as session, pytest.raises(Forbidden, match=refusal):
            runner.approve(session, run.id, people[who])
    with sessions() as session:
        approved = runner.approve(session, run.id, people["olga"])
        session.commit()
    assert approved.state == "queued" and approved.approved_by == "olga"
    assert runner.launch(run.id)
    done = finished(runner, sessions, run.id)
    assert done.state == "succeeded" and done.steps[0]["detail"] == "changed textcls"
    with sessions() as session:
        assert session.get(ApiToken, done.token_id).user_id == people["otto"].user_id  # acts as its requester
        with pytest.raises(Conflict, match="cannot approve a run that is succeeded"):
            runner.approve(session, run.id, people["ada"])
    actions = [(e.action, e.actor, e.outcome) for e in events(sessions)]
    assert actions == [
        ("runbook.request", "otto", "ok"),
        ("runbook.approve", "olga", "ok"),
        ("runbook.start", "system", "ok"),
        ("runbook.finish", "system", "ok"),
    ]
    finish = events(sessions)[-1]
    assert finish.detail["approved_by"] == "olga" and finish.detail["requested_by"] == "otto"


def test_an_approval_not_given_in_time_expires(runner, sessions, people, clock) -> None:
    with sessions() as session:
        run = runner.request(session, "danger", {"model": "textcls"}, people["otto"], Trigger.PERSON)
        session.commit()
    clock.advance(601)
    with sessions() as session, pytest.raises(Conflict, match="cannot approve a run that is expired"):
        runner.approve(session, run.id, people["olga"])
        session.commit()
    with sessions() as session:
        assert runner.expire(session) == 1
        session.commit()
    expired = fetch(sessions, run.id)
    assert expired.state == "expired" and expired.error == "nobody else approved it in time"
    assert [e.action for e in events(sessions)][-1] == "runbook.expire"


def test_a_run_can_be_rejected_or_withdrawn_before_it_starts(runner, sessions, people) -> None:
    with sessions() as session:
        run = runner.request(session, "danger", {"model": "textcls"}, people["otto"], Trigger.PERSON)
        runner.reject(session, run.id, people["otto"], "asked by mistake")
        session.commit()
    assert fetch(sessions, run.id).state == "rejected"
    with sessions() as session, pytest.raises(Conflict):
        runner.approve(session, run.id, people["olga"])


def test_an_alert_runs_a_dangerous_runbook_without_approval_only_if_it_may_run_automatically(
    runner, sessions, people
) -> None:
    run_id = start(
        runner, sessions, "danger", {"model": "textcls"}, None, Trigger.ALERT, reason="alert high_error_rate"
    )
    run = finished(runner, sessions, run_id)
    assert run.state == "succeeded" and run.requested_by == "system" and run.approved_by is None
    with sessions() as session:
        system = get_user(session, "system")
        assert system.role == "operator" and session.get(ApiToken, run.token_id).user_id == system.id
        with pytest.raises(Forbidden, match="may not run automatically"):
            runner.request(session, "steps", {"marker": "x"}, None, Trigger.ALERT)
    # A person asking for the same dangerous runbook still needs a second operator.
    with sessions() as session:
        assert runner.request(session, "danger", {"model": "textcls"}, people["ada"], Trigger.PERSON).state == (
            "awaiting_approval"
        )


def test_a_dry_run_of_a_dangerous_runbook_needs_no_approval_and_gets_no_token(runner, sessions, people) -> None:
    run = finished(
        runner, sessions, start(runner, sessions, "danger", {"model": "textcls"}, people["otto"], dry_run=True)
    )
    assert run.state == "succeeded" and run.token_id is None
    assert run.steps[0]["status"] == "dry-run"


def test_steps_stop_or_continue_as_declared_and_a_failed_run_resumes_at_its_failed_step(
    runner, sessions, people, tmp_path
) -> None:
    marker = tmp_path / "marker"
    run = finished(runner, sessions, start(runner, sessions, "steps", {"marker": str(marker)}, people["otto"]))
    assert run.state == "failed" and run.exit_code == 1
    assert [(s["step"], s["status"]) for s in run.steps] == [
        ("first", "ok"), ("optional", "failed"), ("needs_marker", "failed"), ("last", "skipped"),
    ]  # fmt: skip
    assert run.error == f"step needs_marker failed: {marker} is missing"
    marker.touch()
    with sessions() as session:
        resumed = runner.resume(session, run.id, people["olga"], Trigger.PERSON)
        session.commit()
    assert resumed.from_step == "needs_marker" and resumed.resumed_from == run.id
    runner.launch(resumed.id)
    again = finished(runner, sessions, resumed.id)
    assert again.state == "succeeded"
    assert [(s["step"], s["status"]) for s in again.steps] == [
        ("first", "skipped"), ("optional", "skipped"), ("needs_marker", "ok"), ("last", "ok"),
    ]  # fmt: skip
    with sessions() as session, pytest.raises(Conflict, match="only failed or timed-out runs resume"):
        runner.resume(session, again.id, people["olga"], Trigger.PERSON)


def test_a_timed_out_run_resumes_at_the_step_it_never_finished(runner, sessions, people, gate) -> None:
    run = finished(runner, sessions, start(runner, sessions, "stuck", {"gate": str(gate)}, people["otto"]))
    with sessions() as session:
        resumed = runner.resume(session, run.id, people["otto"], Trigger.PERSON)
    assert resumed.from_step == "wait"


def test_every_step_of_a_run_is_audited(runner, sessions, people, tmp_path) -> None:
    run = finished(runner, sessions, start(runner, sessions, "steps", {"marker": str(tmp_path / "m")}, people["otto"]))
    recorded = [(e.action, e.target, e.outcome) for e in events(sessions)]
    target = f"steps/{run.id}"
    assert recorded == [
        ("runbook.request", target, "ok"),
        ("runbook.start", target, "ok"),
        ("runbook.finish", target, "error"),
    ]
    request, start_event, finish = events(sessions)
    assert request.detail["params"] == {"marker": str(tmp_path / "m")} and request.detail["trigger"] == "person"
    assert start_event.detail["token_id"] == run.token_id  # never the secret
    assert finish.detail["error"].startswith("step needs_marker failed")
    assert isinstance(request.ts, datetime)


def test_shutdown_kills_running_scripts_and_records_why(runner, sessions, people, gate) -> None:
    run_id = start(runner, sessions, "hold", {"model": "textcls", "gate": str(gate)}, people["otto"])
    runner.shutdown()
    run = fetch(sessions, run_id)
    assert run.state == "failed" and run.error == "killed: the server stopped while it ran"
