"""The room of one node's callers: what the per-node client keeps in flight to a
node, bounded by `inflight_max` (requests, and entries of adds) and
`inflight_bytes_max` (bytes of adds and requests), the two taken and given
together through one `netio.budget.BudgetPair`, first come first served.

Every kind of call counts the same way: it takes its room before it puts
anything on the connection (`try_admit`, free when there is room and nobody
waits; else `admit`, waiting in line within the call's timeout) and gives it
back (`release`) once it is answered, failed or given up, whatever the kind.
A call alone on the connection is let through whatever its size.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from netio.budget import BudgetPair, Event
from netio.errors import RequestTimeout


class Admission:
    """The room of one client and the line of callers waiting for it."""

    __slots__ = ("_address", "release", "room", "try_admit")

    def __init__(
        self,
        address: str,
        inflight_max: int,
        inflight_bytes_max: int,
        new_event: Callable[[], Event],
    ) -> None:
        self._address = address
        #: requests (one per frame) and entries of adds in flight, and their bytes
        #: (payloads of adds, frames of other requests)
        self.room = BudgetPair(
            inflight_max, "inflight_max", inflight_bytes_max, "inflight_bytes_max", new_event
        )
        # the room's own methods, bound once: every add takes and gives through them
        #: take room for `count` requests or entries of `size` bytes when both fit
        #: now and nobody waits in line before this caller (True when taken)
        self.try_admit: Callable[[int, int], bool] = self.room.try_take
        #: give back what a call took: the next callers in line get it
        self.release: Callable[[int, int], None] = self.room.give

    async def admit(self, count: int, size: int, timeout_s: float) -> float:
        """Wait in line for room; returns what is left of the call's timeout, or
        raises RequestTimeout when it runs out first (having taken nothing)."""
        started = anyio.current_time()
        room = self.room
        with anyio.move_on_after(timeout_s):
            await room.take(count, size)
            return max(0.0, timeout_s - (anyio.current_time() - started))
        raise RequestTimeout(
            f"no room to send a request to node {self._address} within {timeout_s} s: "
            f"{room.count_used} requests and entries ({room.size_used} bytes) were in "
            f"flight all along (inflight_max {room.count_limit}, inflight_bytes_max "
            f"{room.size_limit}); nothing was sent. Retry, raise inflight_max (or "
            "inflight_bytes_max), or make fewer calls at once"
        )


__all__ = ["Admission"]
