"""Keep-alive connections spread over a node's workers, as gunicorn's own workers spread requests.

gunicorn's sync and gthread workers accept a connection when they have room, so busy workers leave
new ones to idle ones. An event-loop worker accepts every connection that is waiting whenever its
loop wakes: a burst of keep-alive clients (a load generator, a proxy's upstream pool) often landed
all on one worker, which then served them alone while another idled. Measured on 2 cores with
textcls (seq 32): at concurrency 2, 487-579 req/s with both connections on one worker against
657-812 spread, in runs of the same server minutes apart.

Each worker publishes how many connections it holds (8 bytes in a file of its own, mapped in
memory, in `FLIGHTDECK_HOME/connections/`) and reads the others'. A worker that holds two or more
connections more than the least loaded worker answers the inference request it is reading with
`Connection: close`, at most one every MOVE_EVERY_S (never a control call: a client's load-then-ready
sequence keeps its worker), and the client's reconnection goes to whichever worker accepts first:
the least busy, most often. A connection told to move counts as gone from then on: it closes only
once its answer is sent, a batch later, and counted meanwhile it made the worker send several more
away for one surplus, and the two workers overshot each other in turn (textcls seq 128 at concurrency
32, 5 s windows: reconnections in 8 of 12 windows, up to 27 a second; counted as gone, in 2 of 12,
1 a second). Clients lose nothing: HTTP/1.1 clients reconnect on `Connection: close`, and the answer
is whole. (Triton and nginx leave this to the kernel's `SO_REUSEPORT` hash, which spreads many
connections evenly but two or three no better than chance.)
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.config import Settings

MOVE_EVERY_S = 0.02  # the most often one worker asks a client to reconnect elsewhere
REFRESH_S = 0.1  # how often the folder is listed for workers that came or went (a few µs each time)
_COUNT = struct.Struct("<q")


class ConnectionShare:
    """This worker's connection count, published; the other workers' counts, read."""

    def __init__(self, folder: Path, pid: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._folder = folder
        self._name = str(pid if pid is not None else os.getpid())
        self._clock = clock
        self._mine = self._map(folder / self._name, create=True)
        self._others: dict[str, mmap.mmap] = {}
        self._listed_at = -REFRESH_S
        self._next_move = 0.0
        self._leaving = 0  # connections told to move and not closed yet

    @staticmethod
    def _map(path: Path, create: bool) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC if create else os.O_RDONLY, 0o600)
        try:
            if create:
                os.ftruncate(fd, _COUNT.size)
                return mmap.mmap(fd, _COUNT.size)
            return mmap.mmap(fd, _COUNT.size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def publish(self, count: int) -> None:
        """Say how many connections this worker holds now (those told to move not counted)."""
        _COUNT.pack_into(self._mine, 0, max(0, count - self._leaving))

    def left(self) -> None:
        """A connection told to move has closed (call before publishing the count without it)."""
        self._leaving = max(0, self._leaving - 1)

    def others(self) -> list[int]:
        """Return the other live workers' connection counts (the folder re-listed every REFRESH_S)."""
        now = self._clock()
        if now - self._listed_at >= REFRESH_S:
            self._listed_at = now
            names = {p.name for p in self._folder.iterdir() if p.name.isdigit() and p.name != self._name}
            for gone in self._others.keys() - names:
                self._others.pop(gone).close()
            for name in names - self._others.keys():
                try:
                    self._others[name] = self._map(self._folder / name, create=False)
                except (OSError, ValueError):  # gone since the listing, or not yet sized by its worker
                    continue
        return [_COUNT.unpack_from(m, 0)[0] for m in self._others.values()]

    def should_move(self, mine: int) -> bool:
        """Return whether the connection being answered should reconnect elsewhere (two more here than the least).

        `mine` counts every open connection; those already told to move are taken off it.
        """
        staying = mine - self._leaving
        if staying < 2:
            return False
        now = self._clock()
        if now < self._next_move:
            return False
        others = self.others()
        if not others or staying <= min(others) + 1:
            return False
        self._next_move = now + MOVE_EVERY_S
        self._leaving += 1
        self.publish(mine)
        return True

    def close(self) -> None:
        """Withdraw this worker's count (its file goes) and let the others' go."""
        (self._folder / self._name).unlink(missing_ok=True)
        self._mine.close()
        for m in self._others.values():
            m.close()
        self._others.clear()


def connections_folder(settings: Settings) -> Path:
    """Where a node's workers publish their connection counts: emptied when the server starts."""
    return settings.home.resolve() / "connections"


def forget(folder: Path, pid: int) -> None:
    """Remove a dead worker's count (gunicorn's child_exit), so nobody balances against it."""
    (folder / str(pid)).unlink(missing_ok=True)
