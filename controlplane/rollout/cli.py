"""`flightdeck rollout ...`: deploy, act on and roll back from a shell, and wait for the outcome.

Writes desired state straight to the database (audited as the OS user); every running serving
process picks it up within one reconcile poll, so this works with no HTTP and no token. `--wait`
then follows the rollout (see `rollout.follow`): the server's processes load the version and its
leader's controller moves the rollout along, so the wait needs `flightdeck serve` running.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from sqlalchemy import select

from controlplane.auth.audit import audit_as, refusals_recorded
from controlplane.auth.cli import cli_actor
from controlplane.clicontext import (
    EXIT_ROLLOUT_FAILED,
    EXIT_TIMEOUT,
    CliContext,
    CliError,
    FlightdeckGroup,
    emit_json,
    json_option,
    pass_cli,
)
from controlplane.rollout.readmodel import ACTIONS
from controlplane.rollout.states import DEPLOY_STRATEGIES, Slot, Strategy

if TYPE_CHECKING:
    from controlplane.rollout.follow import Outcome

_wait = click.option("--wait", is_flag=True, help="Follow the rollout live; exit 0 only if it succeeds.")
_timeout = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds --wait waits.",
)


def _finish(outcome: Outcome) -> None:
    """Exit with the wait's outcome: 0, or the documented status with its reason."""
    if outcome.ok:
        click.echo(f"done: {outcome.state}: {outcome.reason}")
        return
    raise CliError(f"{outcome.state}: {outcome.reason}", EXIT_TIMEOUT if outcome.timed_out else EXIT_ROLLOUT_FAILED)


@click.group(cls=FlightdeckGroup)
def rollout() -> None:
    """Deploy versions, move rollouts along, roll back."""


@rollout.command("deploy")
@click.argument("model")
@click.argument("version")
@click.option(
    "--strategy",
    type=click.Choice([s.value for s in DEPLOY_STRATEGIES]),
    default=Strategy.CANARY.value,
    show_default=True,
)
@click.option("--steps", help="Traffic percentages, e.g. 5,25,50,100 (canary).")
@click.option("--pause-s", type=float, help="Seconds each step takes traffic before its analysis.")
@click.option("--policy", help='Analysis thresholds as JSON, e.g. {"min_requests": 200}.')
@_wait
@_timeout
@pass_cli
def deploy(
    obj: CliContext, model: str, version: str, strategy: str, steps: str | None, pause_s: float | None,
    policy: str | None, wait: bool, timeout_s: float,
) -> None:  # fmt: skip
    """Start rolling MODEL out to VERSION (or, for a model not deployed yet, start serving VERSION)."""
    from controlplane.models import Deployment
    from controlplane.rollout import deployments, follow, service

    try:
        parsed_steps = [int(s) for s in steps.split(",")] if steps else None
        parsed_policy = json.loads(policy) if policy else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not (obj.registry.folder(obj.registry.get(model, version)) / "model.onnx").is_file():
        raise CliError(f"model '{model}' has no version {version}; push it to the registry first")
    with obj.session() as session:
        if session.get(Deployment, model) is None:  # never served: a first deploy, like the API's
            with refusals_recorded(session, cli_actor(), "model.deploy", f"{model}:{version}"):
                deployments.first_deploy(session, model, version, audit_as(cli_actor()))
            session.commit()
            click.echo(f"{model}: first deploy of version {version}; each process serves it once loaded and verified")
            if wait:
                _finish(follow.follow_first_deploy(obj.sessions, model, version, click.echo, timeout_s=timeout_s))
            return
        with refusals_recorded(session, cli_actor(), "rollout.start", f"{model}:{version}"):
            created = service.deploy(
                session, model, version, f"cli:{cli_actor().name}", audit_as(cli_actor()), strategy=strategy, steps=parsed_steps,
                pause_s=pause_s, policy=parsed_policy, settings=obj.settings.rollout,
            )  # fmt: skip
        session.commit()
        rollout_id = created.id
        click.echo(f"rollout {rollout_id}: {model} {created.from_version} -> {version} ({strategy}), {created.state}")
    if wait:
        _finish(follow.follow_rollout(obj.sessions, rollout_id, click.echo, timeout_s=timeout_s))


@rollout.command("wait")
@click.argument("rollout_id", type=int)
@_timeout
@pass_cli
def wait_for(obj: CliContext, rollout_id: int, timeout_s: float) -> None:
    """Follow a rollout until it ends: exit 0 if it succeeded, non-zero with the reason if not."""
    from controlplane.rollout import follow

    _finish(follow.follow_rollout(obj.sessions, rollout_id, click.echo, timeout_s=timeout_s))


@rollout.command("undeploy")
@click.argument("model")
@click.confirmation_option(prompt="Every serving process stops serving this model. Continue?")
@pass_cli
def undeploy(obj: CliContext, model: str) -> None:
    """Stop serving MODEL everywhere (its versions stay in the registry)."""
    from controlplane.rollout import deployments

    with obj.session() as session:
        with refusals_recorded(session, cli_actor(), "model.undeploy", model):
            result = deployments.undeploy(session, model, audit_as(cli_actor()))
        session.commit()
    held = ", ".join(f"{slot} v{version}" for slot, version in result["versions"].items())
    click.echo(f"{model}: undeployed ({held}); every serving process unloads it")


@rollout.command("rollback")
@click.argument("model")
@_wait
@_timeout
@pass_cli
def rollback(obj: CliContext, model: str, wait: bool, timeout_s: float) -> None:
    """Return MODEL's traffic to its last stable version now."""
    from controlplane.rollout import follow, service

    with obj.session() as session:
        with refusals_recorded(session, cli_actor(), "rollout.rollback", model):
            result = service.rollback(
                session, model, f"cli:{cli_actor().name}", audit_as(cli_actor()), obj.settings.rollout
            )
        session.commit()
    reload = " (reloading it first)" if result["reloaded"] else ""
    click.echo(f"{model}: traffic returning to version {result['version']}{reload}")
    if wait:
        outcome = follow.follow_rollout(obj.sessions, result["rollout"], click.echo, rollback=True, timeout_s=timeout_s)
        _finish(outcome)


@rollout.command("act")
@click.argument("rollout_id", type=int)
@click.argument("action", type=click.Choice(ACTIONS))
@pass_cli
def act(obj: CliContext, rollout_id: int, action: str) -> None:
    """Promote (a step or all the way), pause, resume or abort a rollout."""
    from controlplane.rollout import service

    with obj.session() as session:
        with refusals_recorded(session, cli_actor(), f"rollout.{action}", str(rollout_id)):
            changed = service.act(session, rollout_id, action, f"cli:{cli_actor().name}", audit_as(cli_actor()))
        session.commit()
        click.echo(f"rollout {rollout_id}: {changed.state} ({changed.reason})")


@rollout.command("status")
@click.argument("model")
@json_option
@pass_cli
def status(obj: CliContext, model: str, as_json: bool) -> None:
    """Show MODEL's slots, weights and recent rollouts."""
    from controlplane.models import Deployment, Rollout
    from controlplane.rollout.readmodel import describe_deployment

    with obj.session() as session:
        if as_json:
            described = describe_deployment(session, model, obj.settings.liveness)
            if described is None:
                raise CliError(f"model '{model}' has no deployment")
            emit_json(described)
            return
        desired = session.get(Deployment, model)
        if desired is None:
            raise CliError(f"model '{model}' has no deployment")
        for slot in Slot:
            stable = " (stable)" if slot == desired.stable_slot else ""
            click.echo(
                f"{slot:<6} version {desired.version_in(slot) or '-':<8} weight {desired.weights()[slot]:>3}%{stable}"
            )
        for r in session.scalars(select(Rollout).where(Rollout.model == model).order_by(Rollout.id.desc()).limit(5)):
            click.echo(f"rollout {r.id}: {r.from_version} -> {r.to_version} {r.strategy} {r.state}: {r.reason}")
