"""What every runbook script shares: its declaration, its arguments, its API client and its step records.

A runbook is one executable file, `runbooks/<name>.py`, that declares a module-level `RUNBOOK` dict and
one function per step, and ends with `sys.exit(main(RUNBOOK, STEPS))`. The same file runs three ways:
by a person from a shell, by the server for the console, and by the server for an alert:

    FLIGHTDECK_URL=http://127.0.0.1:8000 FLIGHTDECK_TOKEN=fd_... python runbooks/rollback.py --model textcls

`--describe` prints the declaration as JSON and does nothing else; `--dry-run` prints what each step
would do (no request is sent, no file is written); `--from-step NAME` resumes at a step. Each step
prints one JSON line, {"step", "status": "ok"|"failed"|"skipped"|"dry-run", "detail"}, which the server
records. Exit status: 1 when a step declared `"on_failure": "stop"` failed, 2 for bad arguments, else 0.

A runbook declared dangerous, started from a shell, does not act by itself: it asks the server to run
it (POST /api/runbooks/<name>/runs), where a second operator must approve it first.

Standard library only, so a script runs from a plain shell on an on-call laptop.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV, TOKEN_ENV = "FLIGHTDECK_URL", "FLIGHTDECK_TOKEN"
OUTPUT_DIR_ENV = "FLIGHTDECK_OUTPUT_DIR"  # where files a runbook writes go (default: the current directory)
RUN_ENV = "FLIGHTDECK_RUNBOOK_RUN"  # set by the server's runner: this process is run N, approved if it had to be
MODEL_NAME = r"[a-z0-9][a-z0-9_.-]{0,63}"  # the registry's model names
REQUEST_TIMEOUT_S = 30.0
EXIT_OK, EXIT_STOPPED, EXIT_USAGE = 0, 1, 2

Step = Callable[["Context"], Any]


class StepFailed(Exception):
    """Raise from a step to fail it; the message is what a person on call reads."""


class ApiError(StepFailed):
    """The server answered with an error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Context:
    """What a step gets: its arguments, the API, and what earlier steps learned (`state`).

    In a dry run nothing is sent or written: every call records what it would do in `planned` and
    returns an empty value ({} or ""), so a step that decides on data returns early when `dry_run`.
    """

    def __init__(self, runbook: Mapping[str, Any], params: dict[str, Any], *, dry_run: bool) -> None:
        self.name: str = runbook["name"]
        self.params = params
        self.dry_run = dry_run
        self.url = os.environ.get(URL_ENV, DEFAULT_URL).rstrip("/")
        self.token = os.environ.get(TOKEN_ENV, "")
        self.output_dir = Path(os.environ.get(OUTPUT_DIR_ENV) or ".")
        self.deadline = time.monotonic() + float(runbook["timeout_s"])
        self.state: dict[str, Any] = {}
        self.planned: list[str] = []

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """GET a JSON document from the API."""
        return self._call("GET", path + ("?" + urllib.parse.urlencode(query, safe="*") if query else ""))

    def post(self, path: str, body: Any = None) -> Any:
        """POST (a JSON body, if given) to the API and return the JSON answer."""
        return self._call("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        """PUT a JSON body to the API and return the JSON answer."""
        return self._call("PUT", path, body)

    def text(self, path: str) -> str:
        """GET a text document (such as /metrics)."""
        return self._call("GET", path, as_text=True)

    def write_json(self, file_name: str, data: Any) -> Path:
        """Write `data` as JSON to OUTPUT_DIR/file_name and return the path."""
        path = self.output_dir / file_name
        if self.dry_run:
            self.planned.append(f"would write {path}")
            return path
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        return path

    def require(self, method: str, template: str) -> None:
        """Fail the step with a clear message unless the server's OpenAPI document lists `method template`."""
        if self.dry_run:
            self.planned.append(f"would check that the server offers {method} {template}")
            return
        paths = self.get("/api/openapi.json").get("paths", {})
        if method.lower() not in paths.get(template, {}):
            raise StepFailed(
                f"the server at {self.url} has no {method} {template} endpoint, which this runbook needs; "
                "nothing was changed"
            )

    def wait_for(self, what: str, check: Callable[[], Any], interval_s: float = 0.5) -> Any:
        """Call `check` until it returns something other than None (that is returned) or the runbook's time runs out."""
        if self.dry_run:
            self.planned.append(f"would wait until {what}")
            return None
        while True:
            result = check()
            if result is not None:
                return result
            if time.monotonic() + interval_s > self.deadline - 1:
                raise StepFailed(f"gave up waiting until {what}: the runbook's time ran out")
            time.sleep(interval_s)

    def _call(self, method: str, path: str, body: Any = None, as_text: bool = False) -> Any:
        if self.dry_run:
            shown = "" if body is None else " " + json.dumps(body, sort_keys=True)
            self.planned.append(f"would {method} {path}{shown}")
            return "" if as_text else {}
        headers = {"Accept": "text/plain" if as_text else "application/json", "User-Agent": f"runbook/{self.name}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        timeout = max(1.0, min(REQUEST_TIMEOUT_S, self.deadline - time.monotonic()))
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{method} {path} answered {exc.code}: {_error_message(exc)}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StepFailed(f"cannot reach {self.url} ({method} {path}): {reason}") from None
        if as_text:
            return raw
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise StepFailed(f"{method} {path} answered something that is not JSON") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(exc.read().decode("utf-8", "replace"))["error"]
        message = error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, KeyError, TypeError, OSError):
        message = exc.reason or "error"
    if exc.code == 401:
        message += f" (set {TOKEN_ENV} to an API token)"
    return str(message)


def flag(name: str) -> str:
    """Return the command-line flag of a parameter: max_batch_size -> --max-batch-size."""
    return "--" + name.replace("_", "-")


def _converter(name: str, spec: Mapping[str, Any]) -> Callable[[str], Any]:
    kind = spec["type"]

    def convert(text: str) -> Any:
        if text.startswith("-"):
            raise argparse.ArgumentTypeError(f"{name}: values may not start with '-'")
        if kind == "int":
            if not re.fullmatch(r"[0-9]{1,18}", text):
                raise argparse.ArgumentTypeError(f"{name}: {text!r} is not a whole number")
            value: Any = int(text)
        elif kind == "float":
            if not re.fullmatch(r"[0-9]{1,18}(\.[0-9]{1,18})?", text):
                raise argparse.ArgumentTypeError(f"{name}: {text!r} is not a number")
            value = float(text)
        else:
            value = text
            if "pattern" in spec and not re.fullmatch(spec["pattern"], text):
                raise argparse.ArgumentTypeError(f"{name}: {text!r} does not match {spec['pattern']}")
        if "min" in spec and value < spec["min"] or "max" in spec and value > spec["max"]:
            raise argparse.ArgumentTypeError(f"{name}: {value} is outside {spec.get('min')}..{spec.get('max')}")
        return value

    return convert


def parser(runbook: Mapping[str, Any]) -> argparse.ArgumentParser:
    """Build the command line from the declaration (no abbreviations: flags are spelled out)."""
    step_names = [s["name"] for s in runbook["steps"]]
    result = argparse.ArgumentParser(
        prog=f"runbooks/{runbook['name']}.py", description=runbook["description"], allow_abbrev=False
    )
    result.add_argument("--describe", action="store_true", help="print the declaration as JSON and exit")
    result.add_argument("--dry-run", action="store_true", help="print what each step would do; change nothing")
    result.add_argument("--from-step", choices=step_names, help="resume at this step (earlier ones are skipped)")
    for name, spec in runbook["params"].items():
        names = [flag(name)] + ([f"--{name}"] if "_" in name else [])  # alert commands spell it --max_queue_size
        common = {"dest": name, "default": spec.get("default"), "help": spec.get("help", "")}
        common["required"] = bool(spec.get("required")) and spec.get("default") is None
        if spec["type"] == "bool":
            result.add_argument(*names, action=argparse.BooleanOptionalAction, **common)
        else:
            result.add_argument(*names, type=_converter(name, spec), choices=spec.get("choices"), **common)
    return result


def emit(step: str, status: str, detail: Any) -> None:
    """Print one step record as a JSON line (the server parses these)."""
    print(json.dumps({"step": step, "status": status, "detail": detail}, default=str), flush=True)


def _run_steps(runbook: Mapping[str, Any], steps: Mapping[str, Step], ctx: Context, from_step: str | None) -> int:
    reached, stopped = from_step is None, False
    for step in runbook["steps"]:
        name = step["name"]
        reached = reached or name == from_step
        if not reached:
            emit(name, "skipped", f"resuming at {from_step}")
            continue
        if stopped:
            emit(name, "skipped", "an earlier step failed")
            continue
        first_planned = len(ctx.planned)
        try:
            detail = steps[name](ctx)
        except StepFailed as exc:
            emit(name, "failed", str(exc))
            stopped = step["on_failure"] == "stop"
            continue
        except Exception as exc:  # a bug in the step: recorded like a failure, with its type
            emit(name, "failed", f"{type(exc).__name__}: {exc}")
            stopped = step["on_failure"] == "stop"
            continue
        if ctx.dry_run:
            emit(name, "dry-run", ctx.planned[first_planned:] or "nothing to do")
        else:
            emit(name, "ok", detail)
    return EXIT_STOPPED if stopped else EXIT_OK


def _ask_server(runbook: Mapping[str, Any], ctx: Context, from_step: str | None) -> int:
    body: dict[str, Any] = {"params": ctx.params}
    if from_step:
        body["from_step"] = from_step
    try:
        run = ctx.post(f"/api/runbooks/{runbook['name']}/runs", body)
    except StepFailed as exc:
        print(f"{runbook['name']} is dangerous and runs only through the server, which refused: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    print(
        f"{runbook['name']} is dangerous: the server holds it as run {run.get('id')} ({run.get('state')}); "
        f"a second operator approves it with POST /api/runbooks/runs/{run.get('id')}/approve",
        file=sys.stderr,
    )
    print(json.dumps({"run": run.get("id"), "state": run.get("state")}), flush=True)
    return EXIT_OK


def main(runbook: Mapping[str, Any], steps: Mapping[str, Step], argv: list[str] | None = None) -> int:
    """Run a runbook from its declaration and step functions; return the exit status."""
    declared = [s["name"] for s in runbook["steps"]]
    if sorted(declared) != sorted(steps):
        print(f"{runbook['name']}: declared steps {declared} but implements {sorted(steps)}", file=sys.stderr)
        return EXIT_USAGE
    if "--describe" in (sys.argv[1:] if argv is None else argv):  # before parsing: required flags are not needed
        print(json.dumps(runbook))  # in declaration order: parameters keep theirs
        return EXIT_OK
    args = parser(runbook).parse_args(argv)
    params = {name: getattr(args, name) for name in runbook["params"] if getattr(args, name) is not None}
    ctx = Context(runbook, params, dry_run=args.dry_run)
    if runbook.get("dangerous") and not args.dry_run and not os.environ.get(RUN_ENV):
        return _ask_server(runbook, ctx, args.from_step)
    return _run_steps(runbook, steps, ctx, args.from_step)
