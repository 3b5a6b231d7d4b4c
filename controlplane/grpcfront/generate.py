"""Regenerate `oip_pb2.py` and `oip_pb2.pyi` from `oip.proto` (grpcio-tools, the test extra), or check them.

    python -m controlplane.grpcfront.generate           # write them
    python -m controlplane.grpcfront.generate --check   # exit 1 when the checked-in files are not what protoc makes

NOTE: checked in rather than generated at build: the wheel and the container then need no protoc and no
build step, and the generated code is reviewed like any other change. Only the messages are generated;
the service is registered by hand under its wire name (see oip.proto), so no `_pb2_grpc.py`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("oip_pb2.py", "oip_pb2.pyi")


def generate(out: Path) -> None:
    """Run protoc (grpcio-tools' bundled one) on oip.proto into `out`."""
    from grpc_tools import protoc  # NOTE: here: a development tool, not a run-time dependency

    argv = ["protoc", f"-I{HERE}", f"--python_out={out}", f"--pyi_out={out}", str(HERE / "oip.proto")]
    if protoc.main(argv) != 0:
        raise SystemExit("protoc failed on oip.proto")


def stale() -> list[str]:
    """Return the generated files that differ from what protoc makes now."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in GENERATED if (Path(tmp) / name).read_bytes() != (HERE / name).read_bytes()]


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        changed = stale()
        for name in changed:
            print(f"{name} is stale: run python -m controlplane.grpcfront.generate", file=sys.stderr)
        return 1 if changed else 0
    generate(HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
