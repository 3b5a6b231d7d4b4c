"""The worker's HTTP protocol (controlplane.httpprotocol.BoundedHttpToolsProtocol) on a real socket, in process."""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn
import uvloop

from controlplane.httpprotocol import MAX_HEAD_BYTES, BoundedHttpToolsProtocol


def test_a_pipelined_head_over_the_limit_is_refused_after_the_answer_in_progress_not_instead_of_it() -> None:
    first = b"POST /first HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    huge = b"GET /second HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (8 * MAX_HEAD_BYTES) + b"\r\n\r\n"
    everything_read = threading.Event()
    answer_written = threading.Event()
    errors: list[BaseException] = []

    class Counting(BoundedHttpToolsProtocol):
        received = 0

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            Counting.received += len(data)
            if Counting.received >= len(first) + len(huge):
                everything_read.set()

    async def app(scope, receive, send) -> None:
        await receive()
        # NOTE: answered only once the server has read the pipelined head: an inference request still waiting.
        await asyncio.to_thread(everything_read.wait, 30)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
        except BaseException as exc:
            errors.append(exc)
            raise
        finally:
            answer_written.set()

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    server = uvicorn.Server(uvicorn.Config(app, http=Counting, lifespan="off", log_level="critical"))
    thread = threading.Thread(target=uvloop.run, args=(server.serve(sockets=[listener]),))
    thread.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=30) as client:
            client.sendall(first)
            try:
                client.sendall(huge)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = b""
            while piece := client.recv(65536):
                answer += piece
        assert answer_written.wait(30)
    finally:
        server.should_exit = True
        thread.join(30)
    assert errors == []
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b"over the limit of %d bytes" % MAX_HEAD_BYTES)
    assert answer.count(b"HTTP/1.1 431 ") == 1
