"""The registry's command line: `flightdeck registry build|push|list|show|delete`.

Pushes and deletes go through the registry service straight to the database, audited as the OS user.
`build` and `push` show their progress on stderr (bytes hashed, checks done, golden samples run).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from controlplane.clicontext import CliContext, CliError, FlightdeckGroup, emit_json, json_option, pass_cli
from controlplane.errors import ApiError

if TYPE_CHECKING:
    from controlplane.registry.archive import ArchiveLimits

# NOTE: ONNX, ONNX Runtime and the ORM are imported inside the commands, so that adding this group
# to `flightdeck` costs the other commands nothing at start-up.

_LABELS = {"hashing": "hashing", "unpacking": "unpacking", "checks": "checks", "golden": "golden samples"}
_WIDTH = 24


class StageBar:
    """Show the registry's progress on stderr: a redrawn bar per stage on a terminal, a line per finished stage else."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._open: str | None = None  # the stage whose bar is drawn and not yet ended

    def __call__(self, stage: str, done: int, total: int) -> None:
        """Report `done` of `total` for `stage` (total 0: unknown)."""
        finished = total > 0 and done >= total
        line = self._line(stage, done, total)
        if self._tty:
            if self._open not in (None, stage):
                click.echo(err=True)
            click.echo(f"\r{line}", nl=finished, err=True)
            self._open = None if finished else stage
        elif finished:
            click.echo(line, err=True)

    def close(self) -> None:
        """End a bar left open (a stage that failed half-way)."""
        if self._open is not None:
            click.echo(err=True)
            self._open = None

    @staticmethod
    def _line(stage: str, done: int, total: int) -> str:
        filled = _WIDTH * min(done, total) // total if total else 0
        if stage == "hashing":
            amount = f"{done / 1e6:.1f}/{total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
        else:
            amount = f"{done}/{total}"
        return f"{_LABELS.get(stage, stage):<15} [{'#' * filled}{'.' * (_WIDTH - filled)}] {amount}"


def _pusher() -> str:
    from controlplane.auth.cli import cli_actor

    return f"cli:{cli_actor().name}"


def _sequence_input(value: str) -> tuple[str, tuple[int, float]]:
    name, sep, rest = value.rpartition(":")
    name, sep2, axis = name.rpartition(":")
    try:
        if not (sep and sep2 and name):
            raise ValueError
        pad = float(rest)
        return name, (int(axis), int(pad) if pad.is_integer() else pad)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not NAME:AXIS:PAD, e.g. input_ids:1:0") from None


def _int_list(value: str, flag: str) -> list[int]:
    try:
        return [int(b) for b in value.split(",") if b.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of integers", param_hint=flag) from None


def _warmup_input(value: str) -> tuple[str, dict[str, Any]]:
    """Parse NAME:DIMS[:FILL], e.g. image:1x3x224x224:random or sr::ones (empty DIMS: a scalar)."""
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise click.BadParameter(f"{value!r} is not NAME:DIMS[:FILL], e.g. image:1x3x224x224:random")
    try:
        dims = [int(d) for d in parts[1].split("x")] if parts[1] else []
    except ValueError:
        raise click.BadParameter(f"{value!r}: DIMS must be integers joined by x, e.g. 1x3x224x224") from None
    entry: dict[str, Any] = {"shape": dims}
    if len(parts) == 3:
        entry["fill"] = parts[2]
    return parts[0], entry


@click.group(cls=FlightdeckGroup)
def registry() -> None:
    """Model registry: build, push, list, show and delete model versions."""


@registry.command()
@click.argument("onnx_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="Model name, e.g. textcls.")
@click.option("--version", "version", required=True, help="Version, e.g. 3 or 2026-11-30.")
@click.option(
    "--sequence-input",
    "sequence_inputs",
    multiple=True,
    help="NAME:AXIS:PAD for an input padded along a sequence axis (repeatable), e.g. input_ids:1:0.",
)
@click.option("--sequence-buckets", default="", help="Comma-separated sequence lengths to pad to, e.g. 16,32,64.")
@click.option(
    "--max-batch",
    type=click.IntRange(min=0),
    help="Largest batch the model takes; 0: no batch axis, each request runs alone. "
    "Default: from the graph (0 unless every input and output has a dynamic first axis).",
)
@click.option("--max-queue-delay-ms", type=click.FloatRange(min=0), help="Longest wait for a batch to fill.")
@click.option("--max-queue-size", type=click.IntRange(min=1), help="Samples waiting before new ones are refused.")
@click.option("--preferred-batch-sizes", default="", help="Comma-separated batch sizes sent at once, e.g. 4,8.")
@click.option("--instances", type=click.IntRange(min=1), help="Executor threads, each running its own batch.")
@click.option(
    "--default-timeout-ms", type=click.FloatRange(min=1), help="Request deadline unless the client's is shorter."
)
@click.option(
    "--warmup-input",
    "warmup_inputs",
    multiple=True,
    help="NAME:DIMS[:FILL] (repeatable; together one warm-up sample run at every load), e.g. "
    "image:1x3x224x224:random or sr::ones for a scalar; FILL is zeros (default), ones or random.",
)
@click.option("--golden", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="JSON list of samples.")
@click.option("--description", default="", help="One line about this version.")
@pass_cli
def build(
    obj: CliContext,
    onnx_file: Path,
    out: Path,
    name: str,
    version: str,
    sequence_inputs: tuple[str, ...],
    sequence_buckets: str,
    max_batch: int | None,
    max_queue_delay_ms: float | None,
    max_queue_size: int | None,
    preferred_batch_sizes: str,
    instances: int | None,
    default_timeout_ms: float | None,
    warmup_inputs: tuple[str, ...],
    golden: Path | None,
    description: str,
) -> None:
    """Build an archive from an ONNX file (and its external data) and check it as a push would."""
    from controlplane.registry.archive import ArchiveLimits, build_archive

    samples = None
    if golden is not None:
        try:
            data = json.loads(golden.read_text())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read {golden}: {exc}") from None
        samples = data.get("golden") if isinstance(data, dict) else data
    buckets = _int_list(sequence_buckets, "--sequence-buckets")
    batching = {
        "max_queue_delay_ms": max_queue_delay_ms,
        "max_queue_size": max_queue_size,
        "preferred_batch_sizes": _int_list(preferred_batch_sizes, "--preferred-batch-sizes"),
        "instances": instances,
        "default_timeout_ms": default_timeout_ms,
    }
    warmup = [{"inputs": dict(_warmup_input(v) for v in warmup_inputs)}] if warmup_inputs else None
    try:
        digest = build_archive(
            onnx_file,
            out,
            name=name,
            version=version,
            sequence_inputs=dict(_sequence_input(v) for v in sequence_inputs),
            max_batch_size=max_batch,
            sequence_buckets=buckets,
            golden=samples,
            description=description,
            batching=batching,
            warmup=warmup,
        )
    except (ValueError, OSError) as exc:
        raise CliError(f"cannot build the archive: {exc}") from None
    bar = StageBar()
    try:
        _check(out, ArchiveLimits.from_settings(obj.settings), bar)
    except ApiError as exc:
        out.unlink(missing_ok=True)
        raise CliError(f"the archive would be refused: {exc.message}") from None
    finally:
        bar.close()
    click.echo(f"{out}  sha256 {digest}")


def _check(archive: Path, limits: ArchiveLimits, bar: StageBar) -> None:
    from controlplane.registry.archive import extract_archive
    from controlplane.registry.checks import check_model, read_manifest

    work = Path(tempfile.mkdtemp(prefix="registry-build-"))
    try:
        bar("unpacking", 0, 1)
        folder = extract_archive(archive, work, limits)
        bar("unpacking", 1, 1)
        check_model(folder, read_manifest(folder), bar)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@registry.command()
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sha256", help="Refuse the push unless the archive has this SHA-256.")
@pass_cli
def push(obj: CliContext, archive: Path, sha256: str | None) -> None:
    """Validate and store an archive in the registry."""
    from controlplane.auth.audit import audit_as
    from controlplane.auth.cli import cli_actor

    bar = StageBar()
    try:
        row, created = obj.registry.push(archive, _pusher(), sha256, audit=audit_as(cli_actor()), progress=bar)
    finally:
        bar.close()
    state = "pushed" if created else "already there (same archive)"
    click.echo(f"{row.name} {row.version} {state}  sha256 {row.sha256}")


@registry.command("list")
@click.argument("name", required=False)
@json_option
@pass_cli
def list_versions(obj: CliContext, name: str | None, as_json: bool) -> None:
    """List versions, of one model or all."""
    from controlplane.registry.service import version_dict

    rows = obj.registry.list(name)
    if as_json:
        emit_json([version_dict(row) for row in rows])
        return
    if not rows:
        click.echo("the registry is empty" if name is None else f"model '{name}' has no versions")
        return
    for row in rows:
        tags = f"  [{', '.join(row.tags)}]" if row.tags else ""
        click.echo(f"{row.name:<16} {row.version:<12} {row.sha256[:12]}  {row.size_bytes:>12}  {row.pushed_by}{tags}")


@registry.command()
@click.argument("name")
@click.argument("version")
@pass_cli
def show(obj: CliContext, name: str, version: str) -> None:
    """Show one version as JSON, manifest included (always JSON: it is one document)."""
    from controlplane.registry.service import version_dict

    emit_json(version_dict(obj.registry.get(name, version), manifest=True))


@registry.command()
@click.argument("name")
@click.argument("version")
@click.confirmation_option(prompt="Delete this version and its files?")
@pass_cli
def delete(obj: CliContext, name: str, version: str) -> None:
    """Delete a version and its files (refused while it is deployed)."""
    from controlplane.auth.audit import audit_as
    from controlplane.auth.cli import cli_actor
    from controlplane.rollout.service import deployed_check

    reg = obj.registry
    reg.delete(name, version, _pusher(), deployed=deployed_check(reg.sessions), audit=audit_as(cli_actor()))
    click.echo(f"deleted {name} {version}")
