"""What every CLI command shares: the settings, the database and the registry, opened once per run.

`FlightdeckGroup` is the click group class of `flightdeck` and of each of its groups: it puts one
`CliContext` on the click context (`ctx.obj`), closes it when the command ends, and turns the
errors a command may meet into one line on stderr and a documented exit status (see `EXIT_*` and
the docs' command-line page) instead of a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import ConfigError, Settings, load_settings, mask_secrets, mask_url
from controlplane.errors import ApiError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from controlplane.registry.service import Registry

# Exit statuses, the same for every command (the docs' command-line page lists them).
EXIT_OK = 0
EXIT_REFUSED = 1  # the action was refused or failed: a conflict, a missing model, a rejected archive
EXIT_USAGE = 2  # a bad flag or argument (click's own), or a bad FLIGHTDECK_* setting
EXIT_UNAVAILABLE = 3  # no database (or no schema in it), or the server cannot be reached
EXIT_ROLLOUT_FAILED = 4  # `--wait`: the rollout was rolled back, aborted, or its version failed to load
EXIT_TIMEOUT = 5  # `--wait`: the outcome did not come within --timeout

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


class CliError(click.ClickException):
    """A failure shown as one line (`Error: ...`) with the given exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CliContext:
    """The settings, database engine, sessions and registry one command uses; each made on first use."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._registry: Registry | None = None

    @property
    def settings(self) -> Settings:
        """Return the validated settings; a bad FLIGHTDECK_* variable is a usage error naming it."""
        if self._settings is None:
            try:
                self._settings = load_settings()
            except ConfigError as exc:
                raise CliError(str(exc), EXIT_USAGE) from None
        return self._settings

    def migrate(self, revision: str = "head") -> None:
        """Bring the database schema to `revision`, creating the data directory (and SQLite file) if needed."""
        from controlplane.migrate import upgrade

        self.settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        upgrade(self.settings.sqlalchemy_url, revision)

    @property
    def sessions(self) -> sessionmaker[Session]:
        """Return the session factory; a SQLite file that is not there is an error, never created by a read."""
        if self._sessions is None:
            from controlplane.db import make_engine, session_factory, sqlite_file

            url = self.settings.sqlalchemy_url
            path = sqlite_file(url)
            if path is not None and not path.exists():
                raise CliError(
                    f"no database at {path}; run `flightdeck db upgrade` or start `flightdeck serve` once "
                    "(or set FLIGHTDECK_HOME to the data directory)",
                    EXIT_UNAVAILABLE,
                )
            self._engine = make_engine(url)
            self._sessions = session_factory(self._engine)
        return self._sessions

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Open one session; the caller commits."""
        with self.sessions() as session:
            yield session

    @property
    def registry(self) -> Registry:
        """Return the model registry over this run's sessions, built once."""
        if self._registry is None:
            from controlplane.registry.service import Registry

            self._registry = Registry.for_settings(self.sessions, self.settings)
        return self._registry

    def close(self) -> None:
        """Close the database engine's connections."""
        if self._engine is not None:
            self._engine.dispose()
        self._engine = self._sessions = self._registry = None


def database_error(exc: DBAPIError, settings: Settings) -> CliError:
    """Turn a database failure into one line: a schema that is not there, or a server not reached."""
    where = mask_url(settings.sqlalchemy_url)
    # The driver's own message, first line only (SQLAlchemy appends the statement and a link).
    reason = mask_secrets((str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0])
    if "no such table" in reason or ("relation" in reason and "does not exist" in reason):
        return CliError(
            f"{where} has no schema (or an old one): {reason}; run `flightdeck db upgrade`", EXIT_UNAVAILABLE
        )
    if isinstance(exc, OperationalError):
        return CliError(f"cannot use the database at {where}: {reason}", EXIT_UNAVAILABLE)
    return CliError(f"database error at {where}: {reason}", EXIT_REFUSED)


class FlightdeckGroup(click.Group):
    """A click group that shares one CliContext and shows errors as one line with a documented status."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", CONTEXT_SETTINGS)
        super().__init__(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command with ctx.obj set, translating known failures to CliError."""
        if ctx.obj is None:  # the outermost group of this run owns the context and closes it
            ctx.obj = CliContext()
            ctx.call_on_close(ctx.obj.close)
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            raise CliError(exc.message, EXIT_REFUSED) from None
        except (OperationalError, ProgrammingError) as exc:
            raise database_error(exc, ctx.obj.settings) from None  # loaded: the database was reached for


def _plain(value: Any) -> str:
    return value.isoformat() if isinstance(value, date) else str(value)  # datetimes as ISO 8601, paths as text


def emit_json(data: Any) -> None:
    """Print `data` as indented JSON (datetimes in ISO 8601, paths as strings), for `--json`."""
    click.echo(json.dumps(data, indent=2, default=_plain))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
pass_cli = click.make_pass_decorator(CliContext, ensure=True)
