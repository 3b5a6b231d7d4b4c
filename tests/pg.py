"""Throwaway PostgreSQL clusters for tests: initdb in a temp dir, 127.0.0.1 only, trust auth.

PostgreSQL refuses to run as root, so when the tests run as root the cluster is created and run by
the `postgres` OS user in a temp directory it owns. Startup and shutdown synchronise on pg_ctl's
own `-w` wait; nothing here sleeps.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_USER = "postgres"
PG_CTL_TIMEOUT_S = 30
# Tuned for a disposable test cluster: nothing here needs to survive a crash.
TEST_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "'16MB'",
    "max_connections": "50",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
}


def find_bindir() -> Path | None:
    """Return the directory holding initdb, pg_ctl and postgres, or None if PostgreSQL isn't installed."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    candidates.append(Path("/usr/local/bin"))
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_as() -> pwd.struct_passwd | None:
    """The OS user to run PostgreSQL as: `postgres` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, and PostgreSQL refuses root, but there is no {PG_USER!r} OS user"
        ) from None


def _pg(user: pwd.struct_passwd | None, cwd: Path, *argv: str | Path) -> None:
    """Run a PostgreSQL tool (as `user` when given); raise with its output if it fails."""
    command = [str(arg) for arg in argv]
    if user is not None:
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        command = [runuser, "-u", user.pw_name, "--", *command]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    if user is not None:
        env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    result = subprocess.run(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")


@contextmanager
def postgres_cluster(bindir: Path | None = None) -> Iterator[str]:
    """Start a throwaway cluster; yield `postgresql+psycopg://postgres@127.0.0.1:<port>/postgres`.

    The cluster listens on 127.0.0.1 at a free port (its unix socket lives inside the temp dir), trusts
    every local connection, and is stopped (`pg_ctl stop -m immediate`) and deleted afterwards.
    """
    bindir = bindir or find_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="flightdeck-pg-"))
    data, log = root / "data", root / "postgres.log"
    started = False
    try:
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        os.chmod(root, 0o700)
        _pg(
            user, root, bindir / "initdb", "-D", data, "-U", PG_USER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        port = free_port()
        settings = {**TEST_SETTINGS, "port": str(port), "unix_socket_directories": f"'{root}'"}
        # Appended by root into a file the postgres user owns: ownership and mode stay as initdb left them.
        with (data / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/pg.py\n" + "".join(f"{key} = {value}\n" for key, value in settings.items()))
        try:
            _pg(user, root, bindir / "pg_ctl", "start", "-w", "-t", str(PG_CTL_TIMEOUT_S), "-D", data, "-l", log)
        except RuntimeError as exc:
            server_log = log.read_text(errors="replace") if log.exists() else "(no log)"
            raise RuntimeError(f"{exc}\nserver log:\n{server_log}") from None
        started = True
        yield f"postgresql+psycopg://{PG_USER}@127.0.0.1:{port}/postgres"
    finally:
        try:
            if started:
                _pg(user, root, bindir / "pg_ctl", "stop", "-w", "-m", "immediate", "-D", data)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def create_database(url: str, prefix: str = "test", timezone: str | None = None) -> str:
    """Create a fresh, empty database on the cluster at `url`; return its URL.

    `timezone`, when given, becomes the database's default session TimeZone (e.g. "Asia/Kolkata").
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
            if timezone is not None:
                zone = timezone.replace("'", "''")
                connection.execute(text(f"ALTER DATABASE \"{name}\" SET timezone TO '{zone}'"))
    finally:
        engine.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)
