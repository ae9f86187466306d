"""Bytes of read responses a connection, or the whole node, may hold at once.

A read reserves the most bytes its response can take before it reads anything,
keeps them while the response waits to be sent, and gives them back once the
socket took it (or the connection ended). Reserving waits, first come first
served, while the bytes held are over the limit; a budget holding nothing takes
any one reservation, so that a response larger than the limit is still served,
alone.
"""

from __future__ import annotations

from collections import deque

import trio


class ByteBudget:
    """`used` bytes of `limit`, and the reservations waiting for room, in order."""

    __slots__ = ("_waiting", "limit", "used")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a byte budget's limit must be at least 1, got {limit}")
        self.limit = limit
        self.used = 0
        #: (bytes asked, the event that tells it they were granted)
        self._waiting: deque[tuple[int, trio.Event]] = deque()

    def _fits(self, size: int) -> bool:
        return self.used == 0 or self.used + size <= self.limit

    async def acquire(self, size: int) -> None:
        """Take `size` bytes, waiting in line until they fit."""
        if not self._waiting and self._fits(size):
            self.used += size
            await trio.lowlevel.checkpoint()
            return
        granted = trio.Event()
        ticket = (size, granted)
        self._waiting.append(ticket)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # granted, but this reader will not use them
                self.release(size)
            else:
                self._waiting.remove(ticket)
                self._grant()  # the next in line may fit where this one did not
            raise

    def force(self, size: int) -> None:
        """Take `size` bytes now, over the limit if need be (bytes already held in
        memory, such as a response a little larger than its reservation)."""
        self.used += size

    def release(self, size: int) -> None:
        """Give back `size` bytes and let those waiting in line take what fits."""
        self.used -= size
        self._grant()

    def _grant(self) -> None:
        waiting = self._waiting
        while waiting and self._fits(waiting[0][0]):
            size, granted = waiting.popleft()
            self.used += size
            granted.set()

    @property
    def waiting(self) -> int:
        """Reservations waiting for room."""
        return len(self._waiting)
