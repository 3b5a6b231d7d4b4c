"""Executors carry their model's name in the kernel (serving.threadnames): `top -H` and py-spy tell them apart."""

from __future__ import annotations

from pathlib import Path

from serving.batching import Batcher
from serving.threadnames import KERNEL_NAME_BYTES, executor_name
from tests.fakes import VECTOR_SPEC, Echo


def kernel_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


def test_each_executor_of_a_version_is_named_for_it_in_the_kernel() -> None:
    batcher = Batcher(
        Echo(), VECTOR_SPEC, max_batch_size=4, max_queue_delay_s=0.01, max_queue_size=8, instances=2, name="mlp-green"
    )
    try:
        assert sorted(kernel_name(t.native_id) for t in batcher._threads) == ["mlp-green/0", "mlp-green/1"]
    finally:
        batcher.close(5)


def test_a_long_name_keeps_its_executor_number_within_the_kernels_fifteen_bytes() -> None:
    assert executor_name("textcls-blue", 0) == "textcls-blue/0"
    long = executor_name("a-very-long-model-name-blue", 12)
    assert long == "a-very-long-/12" and len(long.encode()) == KERNEL_NAME_BYTES
