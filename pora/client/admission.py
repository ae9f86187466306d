"""The room of one node's callers: what the per-node client keeps in flight to a
node, bounded by `inflight_max` (requests, and entries of adds) and
`inflight_bytes_max` (bytes of adds and requests), each a `netio.budget.Budget`
handed out first come first served.

Every kind of call counts the same way: it takes its room before it puts
anything on the connection (`try_admit`, free when there is room and nobody
waits; else `admit`, waiting in line within the call's timeout) and gives it
back (`release`) once it is answered, failed or given up, whatever the kind.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from netio.budget import Budget, Event
from netio.errors import RequestTimeout


class Admission:
    """The two budgets of one client and the line of callers waiting for them."""

    __slots__ = ("_address", "bytes", "count")

    def __init__(
        self,
        address: str,
        inflight_max: int,
        inflight_bytes_max: int,
        new_event: Callable[[], Event],
    ) -> None:
        self._address = address
        #: requests (one per frame) and entries of adds in flight
        self.count = Budget(inflight_max, "inflight_max", new_event)
        #: their bytes: payloads of adds, frames of other requests
        self.bytes = Budget(inflight_bytes_max, "inflight_bytes_max", new_event)

    def try_admit(self, count: int, size: int) -> bool:
        """Take room for `count` requests or entries of `size` bytes when both fit
        now and nobody waits in line before this caller."""
        if self.count.try_take(count):
            if self.bytes.try_take(size):
                return True
            self.count.give(count)
        return False

    async def admit(self, count: int, size: int, timeout_s: float) -> float:
        """Wait in line for room; returns what is left of the call's timeout, or
        raises RequestTimeout when it runs out first (having taken nothing)."""
        started = anyio.current_time()
        counted = sized = False
        try:
            with anyio.move_on_after(timeout_s):
                await self.count.take(count)
                counted = True
                await self.bytes.take(size)
                sized = True
        except BaseException:
            if counted and not sized:
                self.count.give(count)
            raise
        if not sized:
            if counted:
                self.count.give(count)
            raise RequestTimeout(
                f"no room to send a request to node {self._address} within {timeout_s} s: "
                f"{self.count.used} requests and entries ({self.bytes.used} bytes) were in "
                f"flight all along (inflight_max {self.count.limit}, inflight_bytes_max "
                f"{self.bytes.limit}); nothing was sent. Retry, raise inflight_max (or "
                "inflight_bytes_max), or make fewer calls at once"
            )
        return max(0.0, timeout_s - (anyio.current_time() - started))

    def release(self, count: int, size: int) -> None:
        """Give back what a call took: the next callers in line get it."""
        self.count.give(count)
        self.bytes.give(size)


__all__ = ["Admission"]
