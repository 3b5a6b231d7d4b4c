"""Free C heap goes back to the OS (serving.memory.trim_heap, the heap-trim job), which glibc does not do by itself below a live block."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.memory import heap_stats, trim_heap


def anonymous_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line in smaps_rollup")


@pytest.mark.skipif(heap_stats() is None or not Path("/proc/self/smaps_rollup").exists(), reason="glibc, Linux")
def test_trim_returns_freed_heap_that_a_live_block_above_it_holds() -> None:
    # NOTE: blocks over pymalloc's 512 bytes come from malloc; the last one stays alive, so the freed ones below
    # it are not at the heap's top, where glibc would give them back by itself: the lease holder's situation.
    blocks = [bytes(4000) for _ in range(20_000)]  # ~80 MB
    keep = bytes(4000)
    del blocks
    held = anonymous_bytes()
    assert trim_heap()
    assert held - anonymous_bytes() > 40_000_000
    assert len(keep) == 4000
