"""The command line: `python -m controlplane COMMAND` for everything that needs no browser."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

import click

from controlplane.auth.cli import audit as audit_command
from controlplane.auth.cli import tokens, users
from controlplane.config import ConfigError, Settings, load_settings, mask_url, settings_table
from controlplane.registry.cli import registry
from controlplane.rollout.cli import rollout


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def cli() -> None:
    """Flightdeck: serve ONNX models and operate them."""


@cli.command()
@click.option("--host", help="Address to bind (FLIGHTDECK_HOST).")
@click.option("--port", type=int, help="Port to bind (FLIGHTDECK_PORT).")
@click.option("--workers", type=int, help="gunicorn workers (FLIGHTDECK_WORKERS).")
def serve(host: str | None, port: int | None, workers: int | None) -> None:
    """Migrate the database, build demo models if needed, and run gunicorn in the foreground."""
    for name, value in (("HOST", host), ("PORT", port), ("WORKERS", workers)):
        if value is not None:
            os.environ[f"FLIGHTDECK_{name}"] = str(value)
    _settings()  # fail here, with a clear message, rather than inside gunicorn
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    # NOTE: exec, so gunicorn's master gets signals (SIGTERM drains) directly.
    os.execv(sys.executable, [sys.executable, "-m", "gunicorn", "-c", os.path.join(root, "gunicorn.conf.py")])


@cli.command()
def prepare() -> None:
    """Make the data directory ready: schema, first admin, an old model store and the demo models in the registry."""
    from controlplane.auth.bootstrap import ensure_initial_admin
    from controlplane.db import make_engine, session_factory
    from controlplane.migrate import upgrade
    from controlplane.modelstore import prepare_home, prepare_store

    settings = _settings()
    prepare_home(settings)
    upgrade(settings.sqlalchemy_url)
    engine = make_engine(settings.sqlalchemy_url)
    sessions = session_factory(engine)
    password = ensure_initial_admin(sessions, settings)
    prepare_store(settings, sessions)
    engine.dispose()
    if password:
        # NOTE: the file (mode 0600) holds the password; printing it would put it in captured logs.
        click.echo(f"Created user 'admin'; its password is in {settings.home / 'initial-admin-password'}")


@cli.group()
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Upgrade the database schema."""
    from controlplane.migrate import upgrade

    settings = _settings()
    settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    upgrade(settings.sqlalchemy_url, revision)
    click.echo(f"database at {mask_url(settings.sqlalchemy_url)} is at {revision}")


@cli.command("demo-models")
def demo_models() -> None:
    """Push the demo models into the registry (versions already there are skipped); deploy with `rollout deploy`."""
    import shutil
    import tempfile
    from pathlib import Path

    from controlplane.db import make_engine, session_factory
    from controlplane.modelstore import prepare_home
    from controlplane.registry.service import Registry
    from controlplane.rollout.cli import _audit
    from serving.demo_models import write_demo_models

    settings = _settings()
    prepare_home(settings)
    engine = make_engine(settings.sqlalchemy_url)
    scratch = Path(tempfile.mkdtemp(prefix="demo-", dir=settings.home / "tmp"))
    try:
        write_demo_models(scratch)
        registry = Registry.for_settings(session_factory(engine), settings)
        for row, created in registry.register_store(scratch, "cli:demo-models", audit=_audit):
            click.echo(f"{row.name} {row.version} {'pushed' if created else 'already there'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        engine.dispose()


@cli.command()
def models() -> None:
    """List the models in the registry with their versions, and which version each deployment serves."""
    from sqlalchemy import select

    from controlplane.db import make_engine, session_factory
    from controlplane.models import Deployment
    from controlplane.registry.service import Registry

    settings = _settings()
    engine = make_engine(settings.sqlalchemy_url)
    sessions = session_factory(engine)
    versions: dict[str, list[str]] = {}
    for row in Registry.for_settings(sessions, settings).list():
        versions.setdefault(row.name, []).append(row.version)
    with sessions() as session:
        served = {d.model: d.version_in(d.stable_slot) for d in session.scalars(select(Deployment))}
    engine.dispose()
    for name, found in versions.items():
        state = f"serves {served[name]}" if name in served else "not deployed"
        click.echo(f"{name}: {', '.join(found)}  ({state})")


@cli.command()
@click.option("--markdown", is_flag=True, help="Print the README's table of settings instead.")
def config(markdown: bool) -> None:
    """Print the effective settings (secrets hidden)."""
    if markdown:
        click.echo(settings_table())
        return
    settings = _settings()
    for key, shown in settings.printable().items():  # secrets masked, database passwords too
        click.echo(f"FLIGHTDECK_{key.upper()}={shown}")


@cli.command()
@click.option("--url", help="Server base URL (default: from FLIGHTDECK_HOST/PORT).")
@click.option("--token", envvar="FLIGHTDECK_TOKEN", help="A viewer's API token (or FLIGHTDECK_TOKEN); reads need one.")
def status(url: str | None, token: str | None) -> None:
    """Show what a running server serves: readiness, models, slots, providers, weights."""
    settings = _settings()
    base = url or f"http://{settings.host}:{settings.port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(f"{base}/api/engine", headers=headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            data = json.load(response)
    except urllib.error.HTTPError as exc:
        hint = (
            " (set FLIGHTDECK_TOKEN to a viewer's token: python -m controlplane tokens create)"
            if exc.code == 401
            else ""
        )
        raise click.ClickException(f"{base} refused: HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {base}: {exc}") from None
    click.echo(f"{base}  ready={data['ready']} draining={data['draining']}")
    for model in data["models"]:
        click.echo(f"  {model['name']}  ready={model['ready']}  weights={model['weights']}")
        for slot, info in model["slots"].items():
            click.echo(f"    {slot}: version {info['version']} on {info['provider']}, queue {info['queue_depth']}")
    sys.exit(0 if data["ready"] else 1)


@cli.command()
@click.option("--since", default="-1h", show_default=True, help="Start: 'now', -15m, -6h, -7d or ISO 8601.")
@click.option("--until", "until", default="now", show_default=True, help="End, in the same forms.")
@click.option("--model", help="Only this model.")
def history(since: str, until: str, model: str | None) -> None:
    """Print key figures per model/version/slot for a time range, from the stored history."""
    from datetime import UTC, datetime

    from controlplane.db import make_engine, session_factory
    from controlplane.errors import ApiError
    from controlplane.history.query import summary
    from controlplane.timeparse import parse_time

    settings = _settings()
    now = datetime.now(UTC)
    try:
        start, end = parse_time(since, "since", now), parse_time(until, "until", now)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    if start >= end:
        raise click.ClickException("--since must be before --until")
    engine = make_engine(settings.sqlalchemy_url)
    with session_factory(engine)() as session:
        rows = summary(session, start, end, model)
    engine.dispose()
    click.echo(f"{start:%Y-%m-%d %H:%M:%S} .. {end:%Y-%m-%d %H:%M:%S} UTC")
    if not rows:
        click.echo("no history in this range")
        return
    header = f"{'model':<10} {'ver':<4} {'slot':<5} {'requests':>9} {'req/s':>8} {'err%':>6} {'tmo%':>6} {'rej%':>6} {'p50 ms':>8} {'p99 ms':>8} {'pad%':>6}"
    click.echo(header)

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value * 100:.2f}"

    def num(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for r in rows:
        click.echo(
            f"{r['model']:<10} {r['version']:<4} {r['slot']:<5} {int(r['requests']):>9} {num(r['throughput']):>8} "
            f"{pct(r['error_rate']):>6} {pct(r['timeout_rate']):>6} {pct(r['rejection_rate']):>6} "
            f"{num(r['p50']):>8} {num(r['p99']):>8} {pct(r['padding_waste']):>6}"
        )


cli.add_command(users)
cli.add_command(tokens)
cli.add_command(audit_command)
cli.add_command(registry)
cli.add_command(rollout)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Run the serving benchmark (same flags as `python -m serving.bench`)."""
    from serving.bench import main

    sys.exit(main(ctx.args))
