"""`Budget`: a bounded amount (bytes, or a count) that holders take from and give
back, handed out first come first served, so that what is held in flight never
grows without bound.

Both ends of the wire bound what they hold with it: the client its pending
appends and their bytes, the server the bytes of read responses a connection,
or the whole node, holds until the socket takes them.

- Taking is free when there is room and nobody waits in line: no await and no
  checkpoint (the append path takes once per append).
- A taker finding no room waits in line; a later, smaller taker does not pass it.
- A budget holding nothing grants any one amount, so that an amount over the
  whole limit is served alone rather than stuck.

The waiting is done with an event of the caller's event loop (`new_event`:
`trio.Event`, `anyio.Event`, ...), so the budget itself imports none and fits
this room, which does no I/O.

`BudgetPair` bounds two amounts taken and given together (a count and its
bytes) with one line of takers, at the cost of one call each way: the client
takes room for each add through it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from ledger.errors import InvalidArgument


class Event(Protocol):
    """What the budget needs of an event: trio's, anyio's and asyncio's all fit."""

    def set(self) -> object: ...
    def is_set(self) -> bool: ...
    def wait(self) -> Awaitable[object]: ...


class Budget:
    """`used` of `limit`, and the takers waiting for room, in order."""

    __slots__ = ("_new_event", "_waiting", "limit", "used", "what")

    def __init__(self, limit: int, what: str, new_event: Callable[[], Event]) -> None:
        if limit < 1:
            raise InvalidArgument(f"{what}: the limit must be at least 1, not {limit}")
        self.limit = limit
        #: what the budget bounds, for the messages of those who report on it
        self.what = what
        self.used = 0
        self._new_event = new_event
        #: (amount asked, the event set once it is granted)
        self._waiting: deque[tuple[int, Event]] = deque()

    def try_take(self, amount: int) -> bool:
        """Take `amount` when it fits now and nobody waits before it."""
        if self._waiting:
            return False
        if self.used + amount <= self.limit or self.used == 0:  # (the usual answer first)
            self.used += amount
            return True
        return False

    async def take(self, amount: int) -> None:
        """Take `amount`, waiting in line until it fits. A taker cancelled while it
        waits takes nothing, and one granted as it was cancelled gives it back."""
        if self.try_take(amount):
            return
        granted = self._new_event()
        ticket = (amount, granted)
        self._waiting.append(ticket)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                self.give(amount)
            else:
                self._waiting.remove(ticket)
                self._grant()  # the next in line may fit where this one did not
            raise

    def force(self, amount: int) -> None:
        """Take `amount` now, over the limit if need be: for what is already in
        memory (a response a little larger than its reservation)."""
        self.used += amount

    def give(self, amount: int) -> None:
        """Give back `amount`, and grant those waiting in line what now fits."""
        self.used -= amount
        if self._waiting:
            self._grant()

    def _grant(self) -> None:
        waiting = self._waiting
        while waiting:
            amount, granted = waiting[0]
            if self.used != 0 and self.used + amount > self.limit:
                return
            waiting.popleft()
            self.used += amount
            granted.set()

    @property
    def waiting(self) -> int:
        """Takers waiting in line for room."""
        return len(self._waiting)


class BudgetPair:
    """Two amounts bounded together, `count_used` of `count_limit` and `size_used`
    of `size_limit`, each by `Budget`'s rules, and one line of takers: a taker
    gets both amounts at once or waits for both, so that it never holds one
    while it waits for the other. Holding nothing grants any one taker."""

    __slots__ = (
        "_new_event",
        "_waiting",
        "count_limit",
        "count_used",
        "count_what",
        "size_limit",
        "size_used",
        "size_what",
    )

    def __init__(
        self,
        count_limit: int,
        count_what: str,
        size_limit: int,
        size_what: str,
        new_event: Callable[[], Event],
    ) -> None:
        for limit, what in ((count_limit, count_what), (size_limit, size_what)):
            if limit < 1:
                raise InvalidArgument(f"{what}: the limit must be at least 1, not {limit}")
        self.count_limit = count_limit
        self.size_limit = size_limit
        #: what each amount bounds, for the messages of those who report on it
        self.count_what = count_what
        self.size_what = size_what
        self.count_used = 0
        self.size_used = 0
        self._new_event = new_event
        #: (count asked, size asked, the event set once both are granted)
        self._waiting: deque[tuple[int, int, Event]] = deque()

    def _fits(self, count: int, size: int) -> bool:
        return (self.count_used + count <= self.count_limit or self.count_used == 0) and (
            self.size_used + size <= self.size_limit or self.size_used == 0
        )

    def try_take(self, count: int, size: int) -> bool:
        """Take `count` and `size` when both fit now and nobody waits before them."""
        if self._waiting:
            return False
        # _fits written out: this is taken once per add
        count_used = self.count_used
        size_used = self.size_used
        if (count_used + count <= self.count_limit or count_used == 0) and (
            size_used + size <= self.size_limit or size_used == 0
        ):
            self.count_used = count_used + count
            self.size_used = size_used + size
            return True
        return False

    async def take(self, count: int, size: int) -> None:
        """Take both amounts, waiting in line until they fit. A taker cancelled while
        it waits takes nothing, and one granted as it was cancelled gives them back."""
        if self.try_take(count, size):
            return
        granted = self._new_event()
        ticket = (count, size, granted)
        self._waiting.append(ticket)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                self.give(count, size)
            else:
                self._waiting.remove(ticket)
                self._grant()  # the next in line may fit where this one did not
            raise

    def give(self, count: int, size: int) -> None:
        """Give back both amounts, and grant those waiting in line what now fits."""
        self.count_used -= count
        self.size_used -= size
        if self._waiting:
            self._grant()

    def _grant(self) -> None:
        waiting = self._waiting
        while waiting:
            count, size, granted = waiting[0]
            if not self._fits(count, size):
                return
            waiting.popleft()
            self.count_used += count
            self.size_used += size
            granted.set()

    @property
    def waiting(self) -> int:
        """Takers waiting in line for room."""
        return len(self._waiting)


__all__ = ["Budget", "BudgetPair", "Event"]
