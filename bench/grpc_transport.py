"""What gRPC's Python server costs per call, by design: `python -m bench.grpc_transport`.

The design question behind controlplane/grpcfront: serve gRPC with `grpc.aio` on the worker's own event
loop (uvloop, as HTTP), with `grpc.aio` on asyncio's default loop, or with gRPC's thread-pool server
(`grpc.server` + ThreadPoolExecutor, a handler blocking in its thread). Each variant here answers
ModelInfer with fixed bytes (no protobuf, no engine): what is left is the transport's own cost. Each
runs in a process of its own, driven by bench.grpcload at c=1 and c=32; printed: req/s, the server's
CPU µs per call, and the client's (it shares the cores).

    python -m bench.grpc_transport [--seconds 2] [--modes aio-uvloop,aio-asyncio,threads]
    python -m bench.grpc_transport --serve MODE PORT     # one variant's server (what the benchmark starts)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from bench.grpcload import MODEL_INFER
from bench.loadgen import drive
from bench.peers import tree_cpu_s
from bench.process import ROOT, free_port

MODES = ("aio-uvloop", "aio-asyncio", "threads")
SERVICE, METHOD = MODEL_INFER.strip("/").split("/")
ANSWER = b"\x0a\x03mlp\x12\x011" + b"\x32\x00" + b"\x00" * 40  # model_name, model_version, then 40 bytes of padding
REQUEST = b"\x0a\x03mlp" + b"\x3a\x80\x02" + b"\x00" * 256  # model_name, and 256 raw input bytes


def _handler(function) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(function)})


def serve(mode: str, port: int) -> None:
    """Serve ModelInfer with fixed bytes in `mode` until killed; print `ready` once listening."""
    if mode == "threads":
        server = grpc.server(ThreadPoolExecutor(8))
        server.add_generic_rpc_handlers((_handler(lambda request, context: ANSWER),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return ANSWER

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(answer),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    if mode == "aio-uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def measure(modes: list[str], seconds: float) -> None:
    """Start each variant in turn, drive it at c=1 and c=32, print one line per cell."""
    print(f"cores: {os.cpu_count()}  load average before: {os.getloadavg()}", flush=True)
    print(f"{'server':<13}{'c':>4}{'req/s':>9}{'server CPU µs/call':>20}{'client CPU µs/call':>20}{'load1':>7}")
    for mode in modes:
        port = free_port()
        argv = [sys.executable, "-m", "bench.grpc_transport", "--serve", mode, str(port)]
        server = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            for concurrency in (1, 32):

                def probe(pid: int = server.pid) -> dict[str, float]:
                    return {"t": time.perf_counter(), "cpu": tree_cpu_s(pid)}

                load1 = os.getloadavg()[0]
                result = drive(port, MODEL_INFER, REQUEST, concurrency, 0.5, seconds, probe, generator="bench.grpcload")
                ok = result.statuses.get(200, 0)
                per_call = 1e6 / max(ok, 1)
                print(f"{mode:<13}{concurrency:>4}{ok / result.seconds:>9.0f}{result.delta('cpu') * per_call:>20.0f}"
                      f"{result.cpu_s * per_call:>20.0f}{load1:>7.2f}", flush=True)  # fmt: skip
        finally:
            server.kill()
            server.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.grpc_transport", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=2.0, help="measurement window per cell")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help="run one variant's server")
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return 0
    measure([m for m in args.modes.split(",") if m], args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
