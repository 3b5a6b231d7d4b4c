"""The command line: `flightdeck COMMAND` (the same program as `python -m controlplane COMMAND`).

Every group shares one `CliContext` (settings, database, registry; see `controlplane.clicontext`),
read commands take `--json`, and failures are one line with a documented exit status.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from importlib.resources import files
from pathlib import Path

import click

import controlplane
from controlplane import __version__
from controlplane.auth.cli import audit as audit_command
from controlplane.auth.cli import tokens, users
from controlplane.clicontext import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    CliContext,
    CliError,
    FlightdeckGroup,
    emit_json,
    json_option,
    pass_cli,
)
from controlplane.config import mask_url, settings_table
from controlplane.registry.cli import registry
from controlplane.rollout.cli import rollout


@click.group(cls=FlightdeckGroup)
@click.version_option(__version__, "--version", prog_name="flightdeck", message="%(prog)s %(version)s")
def cli() -> None:
    """Flightdeck: serve ONNX models and operate them.

    Exit status: 0 done; 1 refused or failed; 2 bad usage or setting; 3 no database or server
    unreachable; 4 a waited-for rollout did not succeed; 5 the wait timed out.
    """


@cli.command()
@click.option("--host", help="Address to bind (FLIGHTDECK_HOST).")
@click.option("--port", type=int, help="Port to bind (FLIGHTDECK_PORT).")
@click.option("--workers", type=int, help="gunicorn workers (FLIGHTDECK_WORKERS).")
@pass_cli
def serve(obj: CliContext, host: str | None, port: int | None, workers: int | None) -> None:
    """Migrate the database, build demo models if needed, and run gunicorn in the foreground."""
    for name, value in (("HOST", host), ("PORT", port), ("WORKERS", workers)):
        if value is not None:
            os.environ[f"FLIGHTDECK_{name}"] = str(value)
    settings = obj.settings  # read after the flags: fail here, with a clear message, rather than inside gunicorn
    # NOTE: a relative FLIGHTDECK_HOME means the caller's folder, for the master, `prepare` and every worker.
    os.environ["FLIGHTDECK_HOME"] = str(settings.home.resolve())
    config = files("controlplane") / "gunicorn.conf.py"  # package data: a checkout and site-packages alike
    app_dir = Path(controlplane.__file__).resolve().parent.parent  # where wsgi.py lies beside controlplane/
    # NOTE: glibc's malloc arenas capped at 2 unless the caller set its own (read by glibc at start, so here,
    # before the exec): with one per thread (up to 8 per core), the lease holder's jobs on the scheduler's threads
    # grew its RSS ~60-90 MB an hour under steady load with the bytes in use flat (issue 29; bench.soak).
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    # NOTE: exec, so gunicorn's master gets signals (SIGTERM drains) directly.
    argv = [sys.executable, "-m", "gunicorn", "-c", str(config), "--pythonpath", str(app_dir)]
    os.execv(sys.executable, argv)


@cli.command()
@pass_cli
def prepare(obj: CliContext) -> None:
    """Make the data directory ready: schema, first admin, an old model store and the demo models in the registry."""
    import logging

    from controlplane.auth.bootstrap import ensure_initial_admin
    from controlplane.logconfig import configure_logging
    from controlplane.modelstore import prepare_home, prepare_store

    settings = obj.settings
    configure_logging(settings)  # run by gunicorn's master: its lines in the server's format (text or JSON)
    prepare_home(settings)
    obj.migrate()
    password = ensure_initial_admin(obj.sessions, settings)
    prepare_store(settings, obj.sessions)
    if password:
        # NOTE: the file (mode 0600) holds the password; printing it would put it in captured logs.
        logging.getLogger("controlplane.prepare").info(
            "created user 'admin'; its password is in %s", settings.home / "initial-admin-password"
        )


@cli.group(cls=FlightdeckGroup)
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@pass_cli
def db_upgrade(obj: CliContext, revision: str) -> None:
    """Upgrade the database schema (creating the data directory and SQLite file if needed)."""
    obj.migrate(revision)
    click.echo(f"database at {mask_url(obj.settings.sqlalchemy_url)} is at {revision}")


@cli.command("demo-models")
@pass_cli
def demo_models(obj: CliContext) -> None:
    """Push the demo models into the registry (versions already there are skipped); deploy with `rollout deploy`."""
    import shutil
    import tempfile

    from controlplane.auth.audit import audit_as
    from controlplane.auth.cli import cli_actor
    from controlplane.modelstore import prepare_home
    from serving.demo_models import write_demo_models

    prepare_home(obj.settings)
    scratch = Path(tempfile.mkdtemp(prefix="demo-", dir=obj.settings.home / "tmp"))
    try:
        write_demo_models(scratch)
        pushed = obj.registry.register_store(scratch, f"cli:{cli_actor().name}", audit=audit_as(cli_actor()))
        for row, created in pushed:
            click.echo(f"{row.name} {row.version} {'pushed' if created else 'already there'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@cli.command()
@json_option
@pass_cli
def models(obj: CliContext, as_json: bool) -> None:
    """List the models in the registry with their versions, and which version each deployment serves."""
    from sqlalchemy import select

    from controlplane.models import Deployment

    versions: dict[str, list[str]] = {}
    for row in obj.registry.list():
        versions.setdefault(row.name, []).append(row.version)
    with obj.session() as session:
        served = {d.model: d.version_in(d.stable_slot) for d in session.scalars(select(Deployment))}
    if as_json:
        emit_json([{"name": name, "versions": found, "serves": served.get(name)} for name, found in versions.items()])
        return
    for name, found in versions.items():
        state = f"serves {served[name]}" if name in served else "not deployed"
        click.echo(f"{name}: {', '.join(found)}  ({state})")


@cli.command()
@click.option("--markdown", is_flag=True, help="Print the settings as a Markdown table (the docs' settings page).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object keyed by setting name (as in the TOML).")
@pass_cli
def config(obj: CliContext, markdown: bool, as_json: bool) -> None:
    """Print the effective settings (secrets hidden)."""
    if markdown:
        click.echo(settings_table())
        return
    settings = obj.settings
    if as_json:
        click.echo(json.dumps(settings.public(), indent=2))  # typed values; secrets masked, as below
        return
    for key, shown in settings.printable().items():  # secrets masked, database passwords too
        click.echo(f"FLIGHTDECK_{key.upper()}={shown}")


@cli.command()
@click.option("--url", help="Server base URL (default: from FLIGHTDECK_HOST/PORT).")
@click.option("--token", envvar="FLIGHTDECK_TOKEN", help="A viewer's API token (or FLIGHTDECK_TOKEN); reads need one.")
@json_option
@pass_cli
def status(obj: CliContext, url: str | None, token: str | None, as_json: bool) -> None:
    """Show what a running server serves (readiness, models, slots, weights) and who leads (exit 1 if not ready)."""
    base = url or f"http://{obj.settings.host}:{obj.settings.port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(f"{base}/api/engine", headers=headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            data = json.load(response)
    except urllib.error.HTTPError as exc:
        hint = " (set FLIGHTDECK_TOKEN to a viewer's token: flightdeck tokens create)" if exc.code == 401 else ""
        raise CliError(f"{base} refused: HTTP {exc.code}{hint}", EXIT_REFUSED) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"cannot reach {base}: {reason}; is `flightdeck serve` running?", EXIT_UNAVAILABLE) from None
    cluster = _read_cluster(base, headers)
    if as_json:
        emit_json({**data, "cluster": cluster})
    else:
        click.echo(f"{base}  ready={data['ready']} draining={data['draining']}")
        if cluster is not None:
            click.echo(f"  {_cluster_line(cluster, data['node'])}")
        for model in data["models"]:
            click.echo(f"  {model['name']}  ready={model['ready']}  weights={model['weights']}")
            for slot, info in model["slots"].items():
                click.echo(f"    {slot}: version {info['version']} on {info['provider']}, queue {info['queue_depth']}")
    sys.exit(0 if data["ready"] else 1)


def _read_cluster(base: str, headers: dict[str, str]) -> dict | None:
    """GET /api/cluster, or None when this server cannot say (an older release, a refused read)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{base}/api/cluster", headers=headers), timeout=5) as r:
            return json.load(r)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _cluster_line(cluster: dict, node: str) -> str:
    """One line: which node answered, who leads and since when, how many processes are alive or gone."""
    leader = cluster.get("leader")
    if leader and leader["current"]:
        lead = f"leader {leader['node']} ({leader['process']}) since {leader['since'][:19].replace('T', ' ')} UTC"
    elif leader:
        lead = (
            f"no leader: the lease of {leader['process']} ran out at {leader['expires_at'][:19].replace('T', ' ')} UTC"
        )
    else:
        lead = "no leader yet"
    processes = [p for n in cluster["nodes"] for p in n["processes"]]
    gone = [p["process"] for p in processes if not p["alive"]]
    alive = f"{len(processes) - len(gone)} process(es) alive on {sum(n['alive'] for n in cluster['nodes'])} node(s)"
    return f"node {node}; {lead}; {alive}" + (f"; gone: {', '.join(gone)}" if gone else "")


@cli.command()
@click.option("--since", default="-1h", show_default=True, help="Start: 'now', -15m, -6h, -7d or ISO 8601.")
@click.option("--until", "until", default="now", show_default=True, help="End, in the same forms.")
@click.option("--model", help="Only this model.")
@json_option
@pass_cli
def history(obj: CliContext, since: str, until: str, model: str | None, as_json: bool) -> None:
    """Print key figures per model/version/slot for a time range, from the stored history."""
    from datetime import UTC, datetime

    from controlplane.errors import ApiError
    from controlplane.history.query import summary
    from controlplane.timeparse import parse_time

    now = datetime.now(UTC)
    try:
        start, end = parse_time(since, "since", now), parse_time(until, "until", now)
    except ApiError as exc:
        raise click.BadParameter(exc.message) from None
    if start >= end:
        raise click.BadParameter("--since must be before --until")
    with obj.session() as session:
        rows = summary(session, start, end, model)
    if as_json:
        emit_json({"since": start.isoformat(), "until": end.isoformat(), "rows": rows})
        return
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


@cli.command()
@click.argument("model")
@click.option(
    "--window", default="-1h", show_default=True, help="Window start, ending now: -15m, -1h, -1d or ISO 8601."
)
@json_option
@pass_cli
def drift(obj: CliContext, model: str, window: str, as_json: bool) -> None:
    """Print each version's drift scores (answers and sampled inputs) against its reference window."""
    from datetime import UTC, datetime

    from controlplane.errors import ApiError
    from controlplane.history import drift as drift_scores
    from controlplane.timeparse import parse_time

    now = datetime.now(UTC)
    try:
        start = parse_time(window, "window", now)
    except ApiError as exc:
        raise click.BadParameter(exc.message) from None
    if start >= now:
        raise click.BadParameter("--window must start before now")
    with obj.session() as session:
        found = drift_scores.describe(session, model, start, now)
    if as_json:
        emit_json(found)
        return
    click.echo(f"{model}: {start:%Y-%m-%d %H:%M:%S} .. {now:%Y-%m-%d %H:%M:%S} UTC, Jensen-Shannon divergence in bits")
    if not found["versions"]:
        click.echo("nothing answered in this window")
    for v in found["versions"]:
        ref = v["reference"]
        where = "none" if ref is None else f"{ref['source']} {ref['start'][:16]} .. {ref['end'][:16]}"
        click.echo(f"v{v['version']} (reference: {where})")
        for s in v["scores"]:
            score = "too few samples" if s["score"] is None else f"{s['score']:.3f}"
            click.echo(f"  {s['kind'] + ':' + s['name']:<40} {score:>16} {s['samples']:>8} samples")


@cli.group("secrets", cls=FlightdeckGroup)
def secrets_group() -> None:
    """The key that encrypts receiver secrets in the database."""


@secrets_group.command("rotate-key")
@pass_cli
def secrets_rotate_key(obj: CliContext) -> None:
    """Encrypt every receiver's secrets with a new key, then drop the old one (HOME/secret.key).

    With FLIGHTDECK_SECRET_KEYS set, put the new key first in it (old ones after) before running
    this; it re-encrypts every receiver with the first key, after which the others may be removed.
    """
    from controlplane.alerting.secretbox import Keyring, rotate_key
    from controlplane.auth.audit import audit_as
    from controlplane.auth.cli import cli_actor

    keys = Keyring.for_settings(obj.settings)
    try:
        count, generated = rotate_key(obj.sessions, keys)
    except ValueError as exc:  # no key file, a malformed key, or a row no configured key opens
        raise CliError(str(exc)) from None
    with obj.session() as session:
        audit_as(cli_actor())(session, "secrets.rotate", "receivers", "ok", {"receivers": count})
        session.commit()
    if generated:
        click.echo(f"new key in {keys.path}; {count} receiver(s) re-encrypted; the old key is gone")
    else:
        click.echo(f"{count} receiver(s) re-encrypted with the first key of FLIGHTDECK_SECRET_KEYS; remove the others")


cli.add_command(users)
cli.add_command(tokens)
cli.add_command(audit_command)
cli.add_command(registry)
cli.add_command(rollout)
