"""The command line every generated file shares: write it, or with --check say whether it is up to date.

`dashboards.grafana` and `dashboards.prometheus` each render one committed file from the code; their
`main` is `generate` with the module's own output path, extra options and renderer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def generate(
    argv: Sequence[str] | None,
    *,
    module: str,
    description: str,
    output: Path,
    render: Callable[[argparse.Namespace], str],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """Run `python -m <module> [--check] [--output PATH] ...`: write the rendered text, or compare with it.

    `render` gets the parsed arguments (the module's own options, added by `add_arguments`) and
    returns the file's text. Returns the exit status: 1 when --check finds the file out of date.
    Example::

        def main(argv=None) -> int:
            return generate(argv, module="dashboards.grafana", description="...", output=OUTPUT,
                            render=lambda args: render())
    """
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--output", type=Path, default=output)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    text = render(args)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python -m {module}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0
