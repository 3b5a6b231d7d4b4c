"""The runner: records runbook runs and starts registered scripts with checked arguments, a token and no shell.

Requests, approvals, rejections and resumptions work in the caller's session and commit nothing
(the caller commits the run and its audit event together). `launch` then starts a queued run in
this process: it claims the row, mints a short-lived token scoped to the runbook's role, starts
the script and supervises it on a thread, recording each step as it arrives and the outcome at the
end, when the token is revoked.

One run at a time per target: a queued or running run holds its target in `active_target`, a
unique column, so a second run for the same model is refused in every process. A run whose
supervising process died is released once its deadline has passed.

Two-person rule: a dangerous runbook asked for by a person waits for a different operator's
approval for `approval_timeout_s`, then expires. A run from an alert needs none, if the runbook
allows automatic runs (the alert rule's own allowance decides how often).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from controlplane import quickread, tracing
from controlplane.auth import SYSTEM_ACTOR, Actor, Role, record_event
from controlplane.auth.errors import Forbidden
from controlplane.auth.tokens import create_token, revoke_token
from controlplane.auth.users import get_user
from controlplane.clock import utcnow
from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.models import ApiToken, User
from controlplane.models.runbook import RunbookRun
from controlplane.runbooks.catalog import RunbookCatalog, runbook_directory, script_env
from controlplane.runbooks.declaration import Runbook, resume_point
from controlplane.runbooks.process import ScriptProcess, ScriptResult
from controlplane.runbooks.states import ACTIVE, RESUMABLE, IllegalTransition, RunState, Trigger, transition

log = logging.getLogger(__name__)

SYSTEM_USER = "system"  # a reserved account name (auth.roles.RESERVED): no person can create or log in as it
UNUSABLE_PASSWORD = "!"  # matches no password: werkzeug refuses a hash without a method
APPROVAL_TIMEOUT_S = 900.0
QUEUE_TIMEOUT_S = 300.0  # a queued run no process started by then expires
TOKEN_MARGIN_S = 60  # a run's token outlives its timeout by this much; a running row is presumed lost after it
MAX_LIST = 500
MAX_DONE_KEPT = 256


def _target(run: RunbookRun) -> str:
    return f"{run.runbook}/{run.id}"


# NOTE: built once: the sweep asks every 2 s, and building the statement cost as much as running it.
_UNFINISHED_STATES = [RunState.AWAITING_APPROVAL.value, *(s.value for s in ACTIVE)]
_UNFINISHED = select(RunbookRun).where(RunbookRun.state.in_(_UNFINISHED_STATES))
_ANY_UNFINISHED = select(exists().where(RunbookRun.state.in_(_UNFINISHED_STATES)))


class RunbookRunner:
    """Record, approve and start runbook runs; supervise the scripts this process started."""

    def __init__(
        self,
        catalog: RunbookCatalog,
        sessions: sessionmaker[Session],
        *,
        api_url: str,
        output_dir: Path,
        cwd: Path | None = None,
        approval_timeout_s: float = APPROVAL_TIMEOUT_S,
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.catalog = catalog
        self._sessions = sessions
        self._api_url = api_url
        self._output_dir = output_dir
        self._cwd = cwd or catalog.directory  # scripts run in their own folder unless told otherwise
        self.approval_timeout_s = approval_timeout_s
        self._queue_timeout_s = queue_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, ScriptProcess] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._done: dict[int, threading.Event] = {}

    # -- requests, in the caller's session ----------------------------------------------------

    def request(
        self,
        session: Session,
        name: str,
        params: Any,
        actor: Actor | None,
        trigger: Trigger,
        *,
        dry_run: bool = False,
        from_step: str | None = None,
        resumed_from: int | None = None,
        reason: str = "",
    ) -> RunbookRun:
        """Record a run (not committed): queued, or awaiting a second operator's approval; `launch` it after commit.

        Refuses unknown runbooks (404), bad arguments (400), a role below the runbook's (403), an alert
        for a runbook that may not run automatically (403), and a target another run is acting on (409).
        """
        runbook = self.catalog.get(name)
        checked = runbook.validate(params)
        if from_step is not None:
            runbook.check_step(from_step)
        now = self._clock()
        if trigger is Trigger.ALERT:
            if not runbook.automatic:
                raise Forbidden(f"runbook {name} may not run automatically; a person must start it")
            if runbook.role > Role.OPERATOR:
                raise Forbidden(f"runbook {name} needs the {runbook.role} role, more than automatic runs get")
            requester, requester_id = SYSTEM_USER, None
        else:
            if actor is None or actor.user_id is None:
                raise Forbidden("a person's run needs a user account: log in, or use an API token")
            if actor.role < runbook.role:
                raise Forbidden(f"runbook {name} needs the {runbook.role} role; {actor.name} has {actor.role}")
            requester, requester_id = actor.name, actor.user_id
        approval = runbook.dangerous and trigger is not Trigger.ALERT and not dry_run
        run = RunbookRun(
            runbook=name, params=checked, target=runbook.target(checked), trigger=trigger.value, reason=reason[:1000],
            state=(RunState.AWAITING_APPROVAL if approval else RunState.QUEUED).value, dry_run=dry_run,
            from_step=from_step, resumed_from=resumed_from, requested_by=requester, requested_by_id=requester_id,
            requested_at=now, approval_deadline=now + timedelta(seconds=self.approval_timeout_s) if approval else None,
            steps=[], output="", error="",
        )  # fmt: skip
        if not approval:
            self._hold_target(session, run, now)
        session.add(run)
        self._flush(session, run)
        detail = {"runbook": name, "params": checked, "trigger": trigger.value, "state": run.state, "dry_run": dry_run}
        if from_step is not None:
            detail.update(from_step=from_step, resumed_from=resumed_from)
        record_event(session, actor or SYSTEM_ACTOR, "runbook.request", _target(run), "ok", detail, now=now)
        return run

    def approve(self, session: Session, run_id: int, actor: Actor) -> RunbookRun:
        """Approve a run awaiting a second operator (not committed): it becomes queued; `launch` it after commit."""
        run = self.get(session, run_id)
        runbook = self.catalog.get(run.runbook)
        now = self._clock()
        self._expire_run(session, run, now)
        self._check(run, "approve")
        if (actor.user_id is not None and actor.user_id == run.requested_by_id) or actor.name == run.requested_by:
            raise Forbidden(f"two-person rule: {actor.name} asked for run {run.id} and cannot also approve it")
        needed = max(runbook.role, Role.OPERATOR)
        if actor.role < needed:
            raise Forbidden(f"approving runbook {run.runbook} needs the {needed} role; {actor.name} has {actor.role}")
        self._hold_target(session, run, now)
        run.state = RunState.QUEUED.value
        run.approved_by, run.approved_at = actor.name, now
        self._flush(session, run)
        record_event(session, actor, "runbook.approve", _target(run), "ok", {"requested_by": run.requested_by}, now=now)
        return run

    def reject(self, session: Session, run_id: int, actor: Actor, reason: str = "") -> RunbookRun:
        """Refuse (or, for its requester, withdraw) a run that has not started (not committed)."""
        run = self.get(session, run_id)
        now = self._clock()
        self._expire_run(session, run, now)
        run.state = self._check(run, "reject").value
        run.active_target, run.finished_at = None, now
        run.error = f"rejected by {actor.name}" + (f": {reason[:500]}" if reason else "")
        record_event(session, actor, "runbook.reject", _target(run), "ok", {"reason": reason[:500]}, now=now)
        return run

    def resume(self, session: Session, run_id: int, actor: Actor | None, trigger: Trigger) -> RunbookRun:
        """Record a new run of a failed one's runbook that starts at the step it failed at (not committed)."""
        old = self.get(session, run_id)
        if RunState(old.state) not in RESUMABLE:
            raise Conflict(f"run {run_id} is {old.state}; only failed or timed-out runs resume")
        if old.dry_run:
            raise Conflict(f"run {run_id} was a dry run: there is nothing to resume")
        step = resume_point(self.catalog.get(old.runbook), old.steps)
        if step is None:
            raise Conflict(f"run {run_id} has no failed step to resume at")
        reason = f"resumes run {old.id} at step {step}"
        return self.request(
            session, old.runbook, old.params, actor, trigger, from_step=step, resumed_from=old.id, reason=reason
        )

    def get(self, session: Session, run_id: int) -> RunbookRun:
        """Return a run; NotFound if there is none."""
        run = session.get(RunbookRun, run_id)
        if run is None:
            raise NotFound(f"no runbook run {run_id}")
        return run

    def list_runs(
        self, session: Session, runbook: str | None = None, state: str | None = None, limit: int = 50
    ) -> list[RunbookRun]:
        """Return runs, newest first."""
        query = select(RunbookRun).order_by(RunbookRun.id.desc()).limit(min(limit, MAX_LIST))
        if runbook:
            query = query.where(RunbookRun.runbook == runbook)
        if state:
            query = query.where(RunbookRun.state == state)
        return list(session.scalars(query))

    def expire(self, session: Session) -> int:
        """Expire approvals past their deadline and queued runs nobody started; release lost runs. Return how many."""
        return self._expire_all(session, self._unfinished(session))

    def _unfinished(self, session: Session) -> list[RunbookRun]:
        """Runs waiting for approval, queued or running: all that `expire` and `launch_queued` act on."""
        return list(session.scalars(_UNFINISHED))

    def _expire_all(self, session: Session, runs: list[RunbookRun]) -> int:
        now = self._clock()
        return sum(self._expire_run(session, run, now) for run in runs)

    # -- starting and supervising, in this process ---------------------------------------------

    def launch(self, run_id: int) -> bool:
        """Start a queued run's script (call after the request or approval committed); False if not started here."""
        now = self._clock()
        try:
            started = self._claim(run_id, now)
        except SQLAlchemyError:
            log.exception("could not claim runbook run %d", run_id)
            return False
        if started is None:
            return False
        argv, env, timeout_s = started
        done = threading.Event()
        process = ScriptProcess(
            argv, env, self._cwd, timeout_s, on_progress=lambda out, step: self._record_progress(run_id, out, step)
        )
        try:
            process.start()
        except OSError as exc:
            self._finish(run_id, ScriptResult(exit_code=None, error=f"could not start: {exc}"))
            return False
        thread = threading.Thread(target=self._supervise, args=(run_id, process, done), name=f"runbook-{run_id}")
        thread.daemon = True
        with self._lock:
            self._running[run_id], self._threads[run_id], self._done[run_id] = process, thread, done
            for old in [k for k, event in self._done.items() if event.is_set()][:-MAX_DONE_KEPT]:
                del self._done[old]  # keep wait() working for recent runs without growing for ever
        thread.start()
        log.info("runbook run %d started: %s", run_id, " ".join(argv[1:]))
        return True

    def launch_queued(self) -> list[int]:
        """Start every queued run (a sweeper for runs whose requesting process did not); return the ids started."""
        with self._sessions() as session:
            ids = list(session.scalars(select(RunbookRun.id).where(RunbookRun.state == RunState.QUEUED.value)))
        return [run_id for run_id in ids if self.launch(run_id)]

    def sweep(self) -> dict[str, int]:
        """One pass of the scheduled job: expire what is due, then start what is queued."""
        if not quickread.holds(self._sessions, _ANY_UNFINISHED):  # NOTE: the usual case, every 2 s
            return {"expired": 0, "started": 0}
        with self._sessions() as session:
            unfinished = self._unfinished(session)
            if not unfinished:  # finished since asked
                return {"expired": 0, "started": 0}
            expired = self._expire_all(session, unfinished)
            session.commit()
        return {"expired": expired, "started": len(self.launch_queued())}

    def wait(self, run_id: int, timeout_s: float | None = None) -> bool:
        """Block until a run this process started has been recorded as finished; False on timeout."""
        with self._lock:
            done = self._done.get(run_id)
        return done.wait(timeout_s) if done is not None else False

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Kill the scripts this process runs and record them as failed (the server is stopping)."""
        with self._lock:
            running, threads = list(self._running.values()), list(self._threads.values())
        for process in running:
            process.stop()
        for thread in threads:
            thread.join(grace_s)

    # -- internals -----------------------------------------------------------------------------

    def _check(self, run: RunbookRun, event: str) -> RunState:
        try:
            return transition(RunState(run.state), event)
        except IllegalTransition as exc:
            raise Conflict(f"run {run.id}: {exc}") from None

    def _flush(self, session: Session, run: RunbookRun) -> None:
        try:
            session.flush()
        except IntegrityError:
            # NOTE: another process took the target between our check and this write; the caller's
            # transaction must be rolled back (the API does; the alert evaluator records the error).
            raise Conflict(f"another run is acting on {run.target} now; one run at a time per target") from None

    def holder(self, session: Session, target: str, now: datetime | None = None) -> RunbookRun | None:
        """Return the run acting on `target` (queued or running), releasing one that is overdue (not committed)."""
        now = now or self._clock()
        holders = list(session.scalars(select(RunbookRun).where(RunbookRun.active_target == target)))
        return next((run for run in holders if not self._expire_run(session, run, now)), None)

    def _hold_target(self, session: Session, run: RunbookRun, now: datetime) -> None:
        if run.dry_run:
            return  # a dry run changes nothing, so it neither waits for a target nor holds one
        holder = self.holder(session, run.target, now)
        if holder is not None:
            raise Conflict(
                f"run {holder.id} ({holder.runbook}, {holder.state}) is acting on {run.target}; "
                "one run at a time per target"
            )
        run.active_target = run.target

    def _expire_run(self, session: Session, run: RunbookRun, now: datetime) -> bool:
        """Expire or release `run` if it is overdue (not committed); return whether it was."""
        state = RunState(run.state)
        if state is RunState.AWAITING_APPROVAL and run.approval_deadline and run.approval_deadline <= now:
            event, error = "expire", "nobody else approved it in time"
        elif (
            state is RunState.QUEUED
            and (run.approved_at or run.requested_at) + timedelta(seconds=self._queue_timeout_s) <= now
        ):
            event, error = "expire", "queued, but no process started it"
        elif state is RunState.RUNNING and run.deadline is not None and run.deadline <= now:
            event, error = "fail", "lost: the process supervising it stopped before it ended"
        else:
            return False
        run.state = transition(state, event).value
        run.active_target, run.finished_at, run.error = None, now, error
        self._revoke(session, run, now)
        action = "runbook.expire" if event == "expire" else "runbook.finish"
        record_event(
            session, SYSTEM_ACTOR, action, _target(run), "error", {"state": run.state, "error": error}, now=now
        )
        session.flush()
        return True

    def _runner_user(self, session: Session, run: RunbookRun, now: datetime) -> User:
        if run.requested_by_id is not None:
            user = session.get(User, run.requested_by_id)
            if user is None or user.disabled:
                raise Forbidden(f"{run.requested_by} no longer has an enabled account")
            return user
        user = get_user(session, SYSTEM_USER)
        if user is None:
            # NOTE: created on first need; the name is reserved, so no person can have taken it.
            user = User(name=SYSTEM_USER, password_hash=UNUSABLE_PASSWORD, role=Role.OPERATOR.value, created_at=now)
            session.add(user)
            session.flush()
        return user

    def _claim(self, run_id: int, now: datetime) -> tuple[list[str], dict[str, str], int] | None:
        """Mark a queued run running (exactly one process wins), mint its token; return what to start."""
        with self._sessions() as session:
            run = session.get(RunbookRun, run_id)
            if run is None or run.state != RunState.QUEUED.value:
                return None
            try:
                runbook = self.catalog.get(run.runbook)
            except ApiError as exc:
                return self._fail_start(session, run, now, exc.message)
            claimed = session.execute(
                update(RunbookRun)
                .where(RunbookRun.id == run_id, RunbookRun.state == RunState.QUEUED.value)
                .values(state=RunState.RUNNING.value, started_at=now)
                .execution_options(synchronize_session=False)
            ).rowcount
            if claimed != 1:
                session.rollback()
                return None
            session.refresh(run)
            run.deadline = now + timedelta(seconds=runbook.timeout_s + TOKEN_MARGIN_S)
            env = {"FLIGHTDECK_URL": self._api_url, "FLIGHTDECK_OUTPUT_DIR": str(self._output_dir)}
            env["FLIGHTDECK_RUNBOOK_RUN"] = str(run.id)
            try:
                argv = self.catalog.command(
                    runbook,
                    runbook.arguments(runbook.validate(run.params), dry_run=run.dry_run, from_step=run.from_step),
                )
                if not run.dry_run:  # a dry run sends no request, so it gets no token
                    env["FLIGHTDECK_TOKEN"] = self._mint(session, run, runbook, now)
            except ApiError as exc:
                return self._fail_start(session, run, now, exc.message)
            detail = {"runbook": run.runbook, "params": run.params, "token_id": run.token_id, "dry_run": run.dry_run}
            record_event(session, SYSTEM_ACTOR, "runbook.start", _target(run), "ok", detail, now=now)
            session.commit()
            return argv, script_env(env), runbook.timeout_s

    def _mint(self, session: Session, run: RunbookRun, runbook: Runbook, now: datetime) -> str:
        user = self._runner_user(session, run, now)
        ttl_s = runbook.timeout_s + TOKEN_MARGIN_S
        token, secret = create_token(session, user, f"runbook-{run.id}", runbook.role, now, ttl_s)
        run.token_id = token.id
        return secret

    def _fail_start(self, session: Session, run: RunbookRun, now: datetime, why: str) -> None:
        session.rollback()
        run = session.get(RunbookRun, run.id)
        if run is not None and RunState(run.state) in ACTIVE:
            run.state, run.active_target, run.finished_at = RunState.FAILED.value, None, now
            run.error = f"could not start: {why}"
            record_event(session, SYSTEM_ACTOR, "runbook.finish", _target(run), "error", {"error": run.error}, now=now)
            session.commit()
        return None

    def _record_progress(self, run_id: int, output: str, step: dict[str, Any] | None) -> None:
        """Record a running script's output so far and its newest step, for people watching it."""
        try:
            with self._sessions() as session:
                run = session.get(RunbookRun, run_id)
                if run is not None and run.state == RunState.RUNNING.value:
                    run.output = output
                    if step is not None:
                        run.steps = [*run.steps, step]
                    session.commit()
        except SQLAlchemyError:
            log.exception("could not record the progress of runbook run %d", run_id)

    def _supervise(self, run_id: int, process: ScriptProcess, done: threading.Event) -> None:
        try:
            with tracing.span("runbook.run", run_id=run_id) as span:
                try:
                    outcome = process.run()
                except Exception as exc:  # never leave a run 'running' because supervising it broke
                    log.exception("supervising runbook run %d failed", run_id)
                    outcome = ScriptResult(exit_code=None, error=f"supervision failed: {exc}")
                if outcome.exit_code is not None:
                    span.set_attribute("flightdeck.exit_code", outcome.exit_code)
                self._finish(run_id, outcome, process.timeout_s)
        finally:
            with self._lock:
                self._running.pop(run_id, None)
                self._threads.pop(run_id, None)
            done.set()

    def _revoke(self, session: Session, run: RunbookRun, now: datetime) -> None:
        token = session.get(ApiToken, run.token_id) if run.token_id is not None else None
        if token is not None:
            revoke_token(session, token, now)

    def _finish(self, run_id: int, outcome: ScriptResult, timeout_s: float = 0.0) -> None:
        now = self._clock()
        with self._sessions() as session:
            run = session.get(RunbookRun, run_id)
            if run is None or run.state != RunState.RUNNING.value:
                return  # already released as lost by someone else; its record stands
            if outcome.timed_out:
                event, error = "time_out", f"killed at the runbook's timeout ({timeout_s:g} s)"
            elif outcome.stopped:
                event, error = "fail", "killed: the server stopped while it ran"
            elif outcome.exit_code == 0:
                event, error = "succeed", ""
            else:
                # The last failed step is the one that stopped the run (everything after it was skipped).
                failed = next((s for s in reversed(outcome.steps) if s["status"] == "failed"), None)
                event = "fail"
                error = outcome.error or (
                    f"step {failed['step']} failed: {failed['detail']}"
                    if failed
                    else f"exited with {outcome.exit_code}"
                )
            run.state = transition(RunState.RUNNING, event).value
            run.exit_code, run.output, run.steps = outcome.exit_code, outcome.output, outcome.steps
            run.error, run.finished_at, run.active_target = str(error)[:2000], now, None
            self._revoke(session, run, now)
            detail = {"state": run.state, "exit_code": run.exit_code, "requested_by": run.requested_by}
            if run.approved_by:
                detail["approved_by"] = run.approved_by
            if error:
                detail["error"] = run.error
            outcome_name = "ok" if run.state == RunState.SUCCEEDED.value else "error"
            record_event(session, SYSTEM_ACTOR, "runbook.finish", _target(run), outcome_name, detail, now=now)
            session.commit()
        log.info("runbook run %d (%s) %s%s", run_id, run.runbook, run.state, f": {run.error}" if run.error else "")


def build_runner(settings: Any, sessions: sessionmaker[Session]) -> RunbookRunner:
    """Build the runner over `runbooks/` for this server: scripts call it back on its own address."""
    host = settings.host if settings.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return RunbookRunner(
        RunbookCatalog(runbook_directory(), python=sys.executable),
        sessions,
        api_url=f"http://{host}:{settings.port}",
        output_dir=settings.home.resolve() / "runbooks",
    )
