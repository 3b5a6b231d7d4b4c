"""What an idle worker's event loop wakes for: DrainingServer's tick and the loop-lag timer, each slower when idle.

An idle worker's loop woke about ten times a second (uvicorn's 0.1 s tick, the lag timer), a third of
a percent of a core; now about once. What must not change with it: a stop signal ends the server at
once, not at its next tick; the heartbeat to the master still goes out every tick; the lag is still
sampled every 0.1 s while clients are connected.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading

import uvicorn
import uvloop

from controlplane import looplag, metrics, worker
from controlplane.worker import DrainingServer


async def _app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def test_a_stop_signal_ends_the_server_at_once_not_at_its_next_tick(monkeypatch) -> None:
    monkeypatch.setattr(worker, "TICK_S", 3600.0)  # NOTE: were the tick not woken, serve() would last an hour
    listener = _listener()
    server = DrainingServer(uvicorn.Config(_app, lifespan="off", log_level="critical"))
    thread = threading.Thread(target=uvloop.run, args=(server.serve(sockets=[listener]),), daemon=True)
    thread.start()
    # NOTE: an answer means the loop is past startup and waiting in main_loop's first tick.
    with socket.create_connection(listener.getsockname(), timeout=30) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert client.recv(1024).startswith(b"HTTP/1.1 200")
    server.handle_exit(signal.SIGTERM, None)
    thread.join(30)
    assert not thread.is_alive(), "the server waited for its next tick to see the stop signal"


def test_every_tick_sends_the_heartbeat_and_does_uvicorns_once_a_second_work(monkeypatch) -> None:
    monkeypatch.setattr(worker, "TICK_S", 0.01)
    ticks, beats = [], []
    enough = threading.Event()

    async def notify() -> None:
        beats.append(server.server_state.default_headers)
        if len(beats) >= 5:
            enough.set()

    class Counted(DrainingServer):
        async def on_tick(self, counter: int) -> bool:
            ticks.append(counter)
            return await super().on_tick(counter)

    config = uvicorn.Config(_app, lifespan="off", log_level="critical", callback_notify=notify, timeout_notify=0.005)
    server = Counted(config)
    thread = threading.Thread(target=uvloop.run, args=(server.serve(sockets=[_listener()]),), daemon=True)
    thread.start()
    assert enough.wait(30), f"{len(beats)} heartbeats in {len(ticks)} ticks"
    server.handle_exit(signal.SIGTERM, None)
    thread.join(30)
    assert not thread.is_alive()
    # One heartbeat per tick (bar the last, which saw should_exit), each with the Date header uvicorn refreshes.
    assert len(beats) >= len(ticks) - 1
    assert all(any(name == b"date" for name, _ in headers) for headers in beats)


def test_the_lag_timer_ticks_every_tenth_of_a_second_while_busy_and_every_second_when_idle() -> None:
    busy = iter([True, True, False, False, True])
    asked: list[float] = []
    lags: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        if len(asked) == 5:
            raise asyncio.CancelledError

    ended: list[BaseException] = []

    def watch() -> None:  # NOTE: a loop of its own, in a thread of its own: this one may hold another test's loop
        try:
            asyncio.run(looplag.watch_loop_lag(lags.append, lambda: next(busy), sleep=sleep))
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=watch)
    thread.start()
    thread.join(30)
    assert len(ended) == 1 and isinstance(ended[0], asyncio.CancelledError), ended
    assert asked == [0.1, 0.1, 1.0, 1.0, 0.1]
    assert lags == [0.0] * 4  # a sleep that returned at once was late by nothing


def test_the_lag_gauge_holds_the_worst_of_each_second_however_many_samples_it_had(monkeypatch) -> None:
    shown: list[float] = []

    class Gauge:
        def set(self, value: float) -> None:
            shown.append(value)

    monkeypatch.setattr(metrics, "LOOP_LAG_MAX", Gauge())
    now = [0.0]
    lag = metrics.LoopLag(clock=lambda: now[0])
    for t, seconds in ((0.1, 0.01), (0.4, 0.2), (0.8, 0.05)):  # busy: several samples in a second
        now[0] = t
        lag.record(seconds)
    assert shown == []
    now[0] = 1.0
    lag.record(0.03)
    assert shown == [0.2]
    now[0] = 2.0  # idle: one sample a second
    lag.record(0.004)
    assert shown == [0.2, 0.004]
