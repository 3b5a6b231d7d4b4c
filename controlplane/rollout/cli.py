"""`python -m controlplane rollout ...`: deploy, act on and roll back from a shell.

Writes desired state straight to the database (audited as the OS user); every running serving
process picks it up within one reconcile poll, so this works with no HTTP and no token.
"""

from __future__ import annotations

import json

import click
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from controlplane.auth.audit import audit_as, refusals_recorded
from controlplane.auth.cli import _database, cli_actor
from controlplane.rollout.states import DEPLOY_STRATEGIES, Slot, Strategy


def _settings():
    from controlplane.auth.cli import _settings as settings

    return settings()


@click.group()
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
def deploy(
    model: str, version: str, strategy: str, steps: str | None, pause_s: float | None, policy: str | None
) -> None:
    """Start rolling MODEL out to VERSION (or, for a model not deployed yet, start serving VERSION)."""
    from controlplane.models import Deployment
    from controlplane.rollout import deployments, service

    try:
        parsed_steps = [int(s) for s in steps.split(",")] if steps else None
        parsed_policy = json.loads(policy) if policy else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    from controlplane.modelstore import version_folder

    with _database() as session:
        sessions = sessionmaker(session.get_bind())
        if not (version_folder(_settings(), sessions, model, version) / "model.onnx").is_file():
            raise click.ClickException(f"model '{model}' has no version {version}; push it to the registry first")
        if session.get(Deployment, model) is None:  # never served: a first deploy, like the API's
            with refusals_recorded(session, cli_actor(), "model.deploy", f"{model}:{version}"):
                deployments.first_deploy(session, model, version, audit_as(cli_actor()))
            session.commit()
            click.echo(f"{model}: first deploy of version {version}; each process serves it once loaded and verified")
            return
        with refusals_recorded(session, cli_actor(), "rollout.start", f"{model}:{version}"):
            created = service.deploy(
                session, model, version, f"cli:{cli_actor().name}", audit_as(cli_actor()), strategy=strategy, steps=parsed_steps,
                pause_s=pause_s, policy=parsed_policy, settings=_settings().rollout,
            )  # fmt: skip
        session.commit()
        click.echo(f"rollout {created.id}: {model} {created.from_version} -> {version} ({strategy}), {created.state}")


@rollout.command("undeploy")
@click.argument("model")
@click.confirmation_option(prompt="Every serving process stops serving this model. Continue?")
def undeploy(model: str) -> None:
    """Stop serving MODEL everywhere (its versions stay in the registry)."""
    from controlplane.rollout import deployments

    with _database() as session:
        with refusals_recorded(session, cli_actor(), "model.undeploy", model):
            result = deployments.undeploy(session, model, audit_as(cli_actor()))
        session.commit()
    held = ", ".join(f"{slot} v{version}" for slot, version in result["versions"].items())
    click.echo(f"{model}: undeployed ({held}); every serving process unloads it")


@rollout.command("rollback")
@click.argument("model")
def rollback(model: str) -> None:
    """Return MODEL's traffic to its last stable version now."""
    from controlplane.rollout import service

    with _database() as session:
        with refusals_recorded(session, cli_actor(), "rollout.rollback", model):
            result = service.rollback(
                session, model, f"cli:{cli_actor().name}", audit_as(cli_actor()), _settings().rollout
            )
        session.commit()
    reload = " (reloading it first)" if result["reloaded"] else ""
    click.echo(f"{model}: traffic returning to version {result['version']}{reload}")


@rollout.command("act")
@click.argument("rollout_id", type=int)
@click.argument("action", type=click.Choice(["promote", "promote_all", "pause", "resume", "abort"]))
def act(rollout_id: int, action: str) -> None:
    """Promote (a step or all the way), pause, resume or abort a rollout."""
    from controlplane.rollout import service

    with _database() as session:
        with refusals_recorded(session, cli_actor(), f"rollout.{action}", str(rollout_id)):
            changed = service.act(session, rollout_id, action, f"cli:{cli_actor().name}", audit_as(cli_actor()))
        session.commit()
        click.echo(f"rollout {rollout_id}: {changed.state} ({changed.reason})")


@rollout.command("status")
@click.argument("model")
def status(model: str) -> None:
    """Show MODEL's slots, weights and recent rollouts."""
    from controlplane.models import Deployment, Rollout

    with _database() as session:
        desired = session.get(Deployment, model)
        if desired is None:
            raise click.ClickException(f"model '{model}' has no deployment")
        for slot in Slot:
            stable = " (stable)" if slot == desired.stable_slot else ""
            click.echo(
                f"{slot:<6} version {desired.version_in(slot) or '-':<8} weight {desired.weights()[slot]:>3}%{stable}"
            )
        for r in session.scalars(select(Rollout).where(Rollout.model == model).order_by(Rollout.id.desc()).limit(5)):
            click.echo(f"rollout {r.id}: {r.from_version} -> {r.to_version} {r.strategy} {r.state}: {r.reason}")
