"""Wait until the database schema is at this image's head; exit 1 after --timeout seconds, or at once if it is newer.

The init container of every Flightdeck pod runs this (mounted from a ConfigMap), so that only the
migration Job runs Alembic's upgrade: a pod starts once the Job has brought the schema to the
head its own image knows, and never migrates concurrently with the Job or another pod.
"""

from __future__ import annotations

import argparse
import sys
import time

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError

from controlplane.config import load_settings, mask_url
from controlplane.migrate import alembic_config

POLL_S = 2.0


def current_heads(url: str) -> set[str]:
    """Return the revisions the database at `url` is at (empty: never migrated, or unreachable)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return set(MigrationContext.configure(connection).get_current_heads())
    except OperationalError:
        return set()  # NOTE: not up yet, or not reachable yet: the same as not migrated, wait on
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Poll the database until its schema is at head; return 0 then, 1 when the timeout runs out or it is newer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (0: look once)")
    args = parser.parse_args(argv)
    url = load_settings().sqlalchemy_url
    script = ScriptDirectory.from_config(alembic_config(url))
    wanted = set(script.get_heads())
    known = {revision.revision for revision in script.walk_revisions()}
    deadline = time.monotonic() + args.timeout
    while True:
        found = current_heads(url)
        if found == wanted:
            print(f"schema of {mask_url(url)} is at {', '.join(sorted(wanted))}", flush=True)
            return 0
        if found - known:
            # NOTE: no use waiting: a newer image's Job migrated past what this image knows, and its own start
            # (Alembic's upgrade in `prepare`) would stop at the unknown revision.
            print(
                f"schema of {mask_url(url)} is at {', '.join(sorted(found - known))}, which this image does not "
                "know: the migration Job ran a newer image; give the Deployment that image",
                file=sys.stderr,
            )
            return 1
        if time.monotonic() >= deadline:
            print(
                f"schema of {mask_url(url)} is at {', '.join(sorted(found)) or 'nothing'}, not "
                f"{', '.join(sorted(wanted))}: has the migration Job (flightdeck db upgrade) run?",
                file=sys.stderr,
            )
            return 1
        time.sleep(POLL_S)  # NOTE: a poll, as Kubernetes' own init containers do; the Job may take minutes


if __name__ == "__main__":
    sys.exit(main())
