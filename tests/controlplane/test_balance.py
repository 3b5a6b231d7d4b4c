"""Keep-alive connections spread over a node's workers (controlplane.balance).

Unit tests of the counts on real mapped files, then a real gunicorn with two workers: a burst of
keep-alive clients ends up spread over both, and every request is answered.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path

from controlplane.balance import MOVE_EVERY_S, REFRESH_S, ConnectionShare, forget
from tests.servers import start_server, wait_until


def counts(folder: Path) -> list[int]:
    """Each worker's published connection count, least first."""
    return sorted(int.from_bytes(p.read_bytes(), "little") for p in folder.iterdir())


def accepted(folder: Path, total: int) -> list[int] | None:
    """The counts once they add up to `total` connections, else None."""
    now = counts(folder)
    return now if sum(now) == total else None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_two_connections_over_the_least_loaded_moves_one_at_a_time(tmp_path: Path) -> None:
    clock = Clock()
    mine, other = ConnectionShare(tmp_path, 1, clock), ConnectionShare(tmp_path, 2, clock)
    try:
        other.publish(0)
        assert not mine.should_move(1)  # one connection: nothing to spread
        assert mine.should_move(2)  # 2 against 0
        assert not mine.should_move(2)  # at most one move every MOVE_EVERY_S
        clock.now += MOVE_EVERY_S
        other.publish(1)
        assert not mine.should_move(2)  # 2 against 1: as even as two workers can hold three
        other.publish(3)
        assert not mine.should_move(3)
        assert other.should_move(5)  # the other worker reads this one's count (published below) as well
    finally:
        mine.close()
        other.close()


def test_a_connection_told_to_move_no_longer_counts_so_one_surplus_moves_one(tmp_path: Path) -> None:
    clock = Clock()
    mine, other = ConnectionShare(tmp_path, 1, clock), ConnectionShare(tmp_path, 2, clock)
    try:
        other.publish(15)
        mine.publish(17)
        assert mine.should_move(17)  # 17 against 15
        assert counts(tmp_path) == [15, 16]  # the one told to move is published as gone
        clock.now += MOVE_EVERY_S
        # NOTE: still open (its answer is a batch away): counted, it would send a second one away, then a third...
        assert not mine.should_move(17)
        mine.left()  # it closed...
        mine.publish(16)
        assert counts(tmp_path) == [15, 16]
        mine.publish(17)  # ... and its client reconnected here: one surplus again
        assert mine.should_move(17)
    finally:
        mine.close()
        other.close()


def test_counts_of_workers_that_came_or_went_are_seen_at_the_next_listing(tmp_path: Path) -> None:
    clock = Clock()
    mine = ConnectionShare(tmp_path, 1, clock)
    try:
        assert mine.others() == [] and not mine.should_move(10)  # alone: nowhere to move to
        late = ConnectionShare(tmp_path, 2, clock)
        late.publish(4)
        assert mine.others() == []  # listed a moment ago
        clock.now += 2 * REFRESH_S
        assert mine.others() == [4]
        forget(tmp_path, 2)  # gunicorn's child_exit for a killed worker
        clock.now += 2 * REFRESH_S
        assert mine.others() == []
        late.close()
    finally:
        mine.close()
    assert list(tmp_path.iterdir()) == []


def test_under_gunicorn_a_burst_of_keep_alive_clients_is_spread_over_both_workers(tmp_path: Path) -> None:
    server = start_server(tmp_path / "home", {"FLIGHTDECK_WORKERS": "2"})
    port = int(server.url.rsplit(":", 1)[1])
    clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(8)]
    folder = tmp_path / "home" / "connections"
    try:
        for client in clients:
            client.connect()  # a burst: often every one lands on the worker whose loop woke first
        landed = wait_until(lambda: accepted(folder, len(clients)), 10, "the workers to accept every connection")
        closed = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for client in clients:
                # NOTE: a malformed inference request: only inference moves a connection, whatever its answer
                client.request("POST", "/v2/models/mlp/infer", b"{}", {"Content-Type": "application/json"})
                response = client.getresponse()
                response.read()
                assert response.status == 400
                if response.will_close:
                    closed += 1
                    client.close()  # http.client reconnects on the next request
            now = counts(folder)
            if len(now) == 2 and now[1] - now[0] <= 1 and sum(now) == len(clients):
                break
        assert len(now) == 2 and now[1] - now[0] <= 1, (landed, now)
        assert closed >= (landed[-1] - landed[0]) // 2  # each move that lands elsewhere narrows the gap by two
        assert f'reason="rebalanced"}} {float(closed)}' in server.metrics()
    finally:
        for client in clients:
            client.close()
        server.stop()
