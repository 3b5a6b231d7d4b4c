"""Run a merged batch so that only the requests that fail on their own get an error.

When the model fails on a batch, the batch is split in halves and each half retried, down to single
requests (bisection). A request's error is only ever the one it raised when run alone, so no error
text describes another request's data. One bad request among n costs about 1.5 log2(n) extra runs
and never more than 2 log2(n): when a failed group's left half runs clean, the fault must be in the
right half, which is then split without being run whole again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from serving.assembly import Part, assemble, split
from serving.tensors import ModelSpec

RunBatch = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class Isolated:
    """Per request, its outputs or the exception it raised alone; and what the runs cost."""

    results: dict[int, dict[str, np.ndarray] | Exception] = field(default_factory=dict)  # by index in the batch
    real_tokens: int = 0  # of the whole batch's run
    padded_tokens: int = 0
    extra_runs: int = 0  # runs beyond the first, spent bisecting


def run_isolated(run: RunBatch, spec: ModelSpec, parts: Sequence[Part]) -> Isolated:
    """Run `parts` as one batch; on failure bisect, so only the parts that fail alone carry an exception."""
    out = Isolated()
    everything = list(range(len(parts)))

    def attempt(group: list[int]) -> bool:
        members = [parts[i] for i in group]
        try:
            assembled = assemble(spec, members)
            if group is everything:
                out.real_tokens, out.padded_tokens = assembled.real_tokens, assembled.padded_tokens
            else:
                out.extra_runs += 1
            outputs = run(assembled.inputs)
        except Exception as exc:  # the model failing must not kill the executor
            if len(group) == 1:
                out.results[group[0]] = exc
            return False
        offset = 0
        for i, part in zip(group, members):
            out.results[i] = split(spec, outputs, offset, part, assembled.length, len(group) == 1)
            offset += part.batch
        return True

    def bisect(group: list[int], known_to_fail: bool) -> bool:
        """Answer every part of `group`; return whether the group ran whole without error."""
        if len(group) == 1:
            return attempt(group)
        if not known_to_fail and attempt(group):
            return True
        middle = len(group) // 2
        left_ran = bisect(group[:middle], False)
        bisect(group[middle:], left_ran)
        return False

    bisect(everything, False)
    return out
