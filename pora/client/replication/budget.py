"""`Budget`: a bounded count (pending appends of a ledger, pending bytes of a client)
that appends take from and acknowledgements give back. Taking is free when there is
room (no await, no checkpoint: the append fast path); a caller finding none waits,
first come first served, so nothing pending grows without bound."""

from __future__ import annotations

from collections import deque

import anyio


class Budget:
    def __init__(self, limit: int, what: str) -> None:
        if limit < 1:
            raise ValueError(f"{what}: the limit must be >= 1, not {limit}")
        self.limit = limit
        self.what = what
        self.used = 0
        self._waiters: deque[tuple[int, anyio.Event]] = deque()

    def try_take(self, amount: int) -> bool:
        """Take `amount` when it fits now (and nobody waits before us). An amount over
        the whole limit fits once nothing else is taken, so it is never stuck."""
        if self._waiters:
            return False
        if self.used + amount <= self.limit or self.used == 0:
            self.used += amount
            return True
        return False

    async def take(self, amount: int) -> None:
        if self.try_take(amount):
            return
        event = anyio.Event()
        waiter = (amount, event)
        self._waiters.append(waiter)
        try:
            await event.wait()
        except BaseException:
            if event.is_set():  # granted as we were cancelled: give it back
                self.give(amount)
            else:
                self._waiters.remove(waiter)
                self._grant()
            raise

    def give(self, amount: int) -> None:
        self.used -= amount
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        while self._waiters:
            amount, event = self._waiters[0]
            if self.used + amount > self.limit and self.used != 0:
                return
            self._waiters.popleft()
            self.used += amount
            event.set()
