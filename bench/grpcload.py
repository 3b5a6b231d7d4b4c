"""A closed-loop gRPC load generator in its own process, for `bench.peers`' gRPC cells: bench.loadgen's protocol.

    python -m bench.grpcload --port P --path /inference.GRPCInferenceService/ModelInfer --concurrency 32 < request

The request is a serialized ModelInferRequest on stdin, sent as bytes (no protobuf work in this
process: the client's CPU stays out of the way, as bench.loadgen's pre-encoded HTTP request does).
`concurrency` callers each keep one call in flight, each over a channel (HTTP/2 connection) of its
own, as bench.loadgen gives each caller a keep-alive connection of its own: with several workers
sharing the port by SO_REUSEPORT, one channel would reach one worker only. UNAVAILABLE (the queue
full, or draining) counts as 503 and waits bench.loadgen's MAX_BACKOFF_S; any other failure counts
as its HTTP equivalent (500 when none). Output: START, END and the JSON result, as bench.loadgen's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import grpc
import uvloop

from bench.loadgen import MAX_BACKOFF_S, Recorder, _say, arguments, measure_window

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
STATUSES = {
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),  # NOTE: else channels to one address share one connection
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


async def keep_calling(channel: grpc.aio.Channel, path: str, body: bytes, recorder: Recorder) -> None:
    """Send `body` again as soon as the previous call ends, until the window has closed."""
    call = channel.unary_unary(path)  # NOTE: no serializers: bytes go out and come back as they are
    while not recorder.draining:
        started = time.perf_counter()
        try:
            await call(body)
        except grpc.aio.AioRpcError as exc:
            status = STATUSES.get(exc.code(), 500)
            recorder.record(status, 0.0)
            if status in (429, 503):
                await asyncio.sleep(MAX_BACKOFF_S)
            continue
        recorder.record(200, time.perf_counter() - started)


async def generate(
    port: int, path: str, body: bytes, concurrency: int, warmup_s: float, seconds: float, drain_s: float = 60
) -> dict[str, Any]:
    """Warm up, print START, record for `seconds`, print END, let the calls in flight end; return the result."""
    recorder = Recorder()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) for _ in range(concurrency)]
    tasks = [asyncio.create_task(keep_calling(channel, path, body, recorder)) for channel in channels]
    window = await measure_window(recorder, warmup_s, seconds)
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in pending:
        task.cancel()
    for channel in channels:
        await channel.close()
    return recorder.result(window)


def main(argv: list[str] | None = None) -> int:
    """Run one closed loop on the request read from stdin; print START, END and the JSON result."""
    args = arguments("python -m bench.grpcload", __doc__, path=MODEL_INFER).parse_args(argv)
    body = sys.stdin.buffer.read()
    result = uvloop.run(generate(args.port, args.path, body, args.concurrency, args.warmup, args.seconds))
    _say(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
