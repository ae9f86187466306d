"""Request deadlines of the per-node client, without a cancel scope per request.

A cancel scope with a deadline per request costs more than the rest of a pipelined
add (trio keeps every deadline in a heap). Instead, waiters go into buckets of
TIMEOUT_TICK_S by deadline, and one sweeper task fails the waiters of each bucket
that has passed: a request times out at most one tick late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import anyio
import trio

from pora.client.coalescer import AddCall
from pora.client.session import Waiter

#: Granularity of request timeouts: a request times out at most this much late.
TIMEOUT_TICK_S: Final = 0.02


class DeadlineSweeper:
    """The deadline buckets of one client and the task that sweeps them
    (`_sweep_deadlines`, run for the client's lifetime; `_sweeper_scope` ends it)."""

    def __init__(self) -> None:
        #: deadline bucket -> waiters whose timeout ends in it
        self._deadlines: dict[int, set[Waiter | AddCall]] = {}
        self._sweeper_wakeup = anyio.Event()
        self._sweeper_scope = anyio.CancelScope()
        #: the event loop's clock: under trio, trio's own (anyio's costs more, once
        #: per request)
        self._now: Callable[[], float] = (
            trio.current_time if trio.lowlevel.in_trio_task() else anyio.current_time
        )

    def _track_deadline(self, waiter: Waiter | AddCall, timeout_s: float) -> int:
        bucket = int((self._now() + timeout_s) / TIMEOUT_TICK_S) + 1
        waiters = self._deadlines.get(bucket)
        if waiters is None:
            waiters = self._deadlines[bucket] = set()
            if not self._sweeper_wakeup.is_set():
                self._sweeper_wakeup.set()
        waiters.add(waiter)
        return bucket

    async def _sweep_deadlines(self) -> None:
        with self._sweeper_scope:
            while True:
                if not self._deadlines:
                    self._sweeper_wakeup = anyio.Event()
                    await self._sweeper_wakeup.wait()
                    continue
                now = int(anyio.current_time() / TIMEOUT_TICK_S)
                for bucket in [b for b in self._deadlines if b <= now]:
                    for waiter in self._deadlines.pop(bucket):
                        if waiter.remaining and waiter.error is None:
                            waiter.timed_out = True
                            waiter.event.set()
                await anyio.sleep(TIMEOUT_TICK_S)


__all__ = ["TIMEOUT_TICK_S", "DeadlineSweeper"]
