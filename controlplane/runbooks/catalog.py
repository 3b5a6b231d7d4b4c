"""The registered runbooks: `runbooks/<name>.py` files whose `--describe` declaration passes the checks.

A script's declaration is read by running it with `--describe` (no shell, a minimal environment,
a short timeout) and kept until the file, or a shared `_*.py` helper beside it, changes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from importlib.resources import files
from pathlib import Path

from controlplane.errors import ApiError, NotFound
from controlplane.runbooks.declaration import NAME, DeclarationError, Runbook, parse_declaration, source

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 10.0
MAX_DESCRIBE_BYTES = 64 * 1024


class InvalidRunbook(ApiError):
    """A runbook script exists but its declaration is unusable (a deployment mistake, not the caller's)."""

    status = 500
    code = "invalid_runbook"


def runbook_directory() -> Path:
    """Return the folder of the shipped runbook scripts (the top-level `runbooks` package, installed or not)."""
    return Path(str(files("runbooks")))


def script_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return the minimal environment a runbook script runs with (nothing of the server's own)."""
    return {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **(extra or {})}


class RunbookCatalog:
    """Find runbook scripts in one directory and read their declarations."""

    def __init__(
        self, directory: Path, python: str = sys.executable, describe_timeout_s: float = DESCRIBE_TIMEOUT_S
    ) -> None:
        self.directory = directory.resolve()
        self.python = python
        self._describe_timeout_s = describe_timeout_s
        self._cache: dict[str, tuple[tuple[int, ...], Runbook | DeclarationError]] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        """Return the names of the scripts that could be runbooks (helpers named _*.py excluded)."""
        if not self.directory.is_dir():
            return []
        return sorted(
            p.stem
            for p in self.directory.glob("*.py")
            if not p.name.startswith("_") and NAME.match(p.stem) and p.is_file()
        )

    def path(self, name: str) -> Path:
        """Return the script of a registered runbook name; NotFound for anything else (no path is built from input)."""
        if not isinstance(name, str) or name not in self.names():
            raise NotFound(f"no runbook {name!r}; see GET /api/runbooks")
        path = self.directory / f"{name}.py"
        if path.resolve().parent != self.directory:
            raise NotFound(f"no runbook {name!r}: its script lies outside {self.directory}")
        return path

    def get(self, name: str) -> Runbook:
        """Return a registered runbook; NotFound, or InvalidRunbook when its declaration is unusable."""
        found = self._describe(name)
        if isinstance(found, DeclarationError):
            raise InvalidRunbook(f"runbook {name} has an unusable declaration: {found}")
        return found

    def all(self) -> tuple[list[Runbook], dict[str, str]]:
        """Return the usable runbooks and, by name, why the others are not."""
        usable, broken = [], {}
        for name in self.names():
            found = self._describe(name)
            if isinstance(found, DeclarationError):
                broken[name] = str(found)
            else:
                usable.append(found)
        return usable, broken

    def command(self, runbook: Runbook, words: list[str]) -> list[str]:
        """Return the argv that runs a runbook's script with checked argument words."""
        return [self.python, str(self.path(runbook.name)), *words]

    def _stamp(self, path: Path) -> tuple[int, ...]:
        helpers = sorted(self.directory.glob("_*.py"))
        return tuple(n for p in (path, *helpers) for n in (p.stat().st_mtime_ns, p.stat().st_size))

    def _describe(self, name: str) -> Runbook | DeclarationError:
        path = self.path(name)
        stamp = self._stamp(path)
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        found = self._run_describe(name, path)
        if isinstance(found, DeclarationError):
            log.error("runbook %s: %s", name, found)
        with self._lock:
            self._cache[name] = (stamp, found)
        return found

    def _run_describe(self, name: str, path: Path) -> Runbook | DeclarationError:
        try:
            done = subprocess.run(
                [self.python, str(path), "--describe"],
                cwd=self.directory,
                env=script_env(),
                capture_output=True,
                timeout=self._describe_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return DeclarationError(f"{source(name)}: --describe did not finish within {self._describe_timeout_s:g} s")
        except OSError as exc:
            return DeclarationError(f"{source(name)}: --describe could not run: {exc}")
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return DeclarationError(f"{source(name)}: --describe exited with {done.returncode}: {tail[0][:500]}")
        if len(done.stdout) > MAX_DESCRIBE_BYTES:
            return DeclarationError(f"{source(name)}: --describe printed more than {MAX_DESCRIBE_BYTES} bytes")
        try:
            data = json.loads(done.stdout)
        except ValueError:
            return DeclarationError(f"{source(name)}: --describe did not print one JSON object")
        try:
            return parse_declaration(data, name)
        except DeclarationError as exc:
            return exc
