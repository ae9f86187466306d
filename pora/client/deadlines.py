"""Request deadlines of the per-node client, without a cancel scope per request.

A cancel scope with a deadline per request costs more than the rest of a pipelined
add (trio keeps every deadline in a heap). Instead one sweeper task, every
TIMEOUT_TICK_S while anything waits, times out what has passed its deadline: a
request times out at most one tick late.

- A request's `Waiter` goes into a bucket of TIMEOUT_TICK_S by deadline.
- A coalesced add (`AddCall`) only carries its deadline: the sweep looks at the
  connection's frames of adds in flight (a handful per turn, each knowing its
  callers' earliest deadline) and at the adds not framed yet, so an add costs no
  bucket bookkeeping. A call of batches (`BatchCall`) likewise, through its frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import anyio
import trio

from pora.client.coalescer import AddFrame
from pora.client.ledger_frames import BatchFrame
from pora.client.session import Session, Waiter

#: Granularity of request timeouts: a request times out at most this much late.
TIMEOUT_TICK_S: Final = 0.02


class DeadlineSweeper:
    """The deadline buckets of one client and the task that sweeps them
    (`_sweep_deadlines`, run for the client's lifetime; `_sweeper_scope` ends it)."""

    _session: Session | None
    _adds_in_flight: int

    def __init__(self) -> None:
        #: deadline bucket -> waiters whose timeout ends in it
        self._deadlines: dict[int, set[Waiter]] = {}
        self._sweeper_wakeup = anyio.Event()
        #: the sweeper waits for work (nothing tracked, no adds in flight)
        self._sweeper_idle = False
        self._sweeper_scope = anyio.CancelScope()
        #: the event loop's clock: under trio, trio's own (anyio's costs more, once
        #: per request)
        self._now: Callable[[], float] = (
            trio.current_time if trio.lowlevel.in_trio_task() else anyio.current_time
        )

    def _track_deadline(self, waiter: Waiter, timeout_s: float) -> int:
        bucket = int((self._now() + timeout_s) / TIMEOUT_TICK_S) + 1
        waiters = self._deadlines.get(bucket)
        if waiters is None:
            waiters = self._deadlines[bucket] = set()
            self._wake_sweeper()
        waiters.add(waiter)
        return bucket

    def _wake_sweeper(self) -> None:
        """Something has a deadline: make sure the sweeper runs (cheap when it does)."""
        if self._sweeper_idle:
            self._sweeper_idle = False
            self._sweeper_wakeup.set()

    async def _sweep_deadlines(self) -> None:
        with self._sweeper_scope:
            while True:
                if not self._deadlines and not self._adds_in_flight:
                    self._sweeper_wakeup = anyio.Event()
                    self._sweeper_idle = True
                    await self._sweeper_wakeup.wait()
                    continue
                now = anyio.current_time()
                tick = int(now / TIMEOUT_TICK_S)
                for bucket in [b for b in self._deadlines if b <= tick]:
                    for waiter in self._deadlines.pop(bucket):
                        if waiter.remaining and waiter.error is None:
                            waiter.timed_out = True
                            waiter.event.set()
                session = self._session
                if session is not None and self._adds_in_flight:
                    _sweep_adds(session, now)
                await anyio.sleep(TIMEOUT_TICK_S)


def _sweep_adds(session: Session, now: float) -> None:
    """Time out the connection's coalesced adds whose deadline has passed."""
    for waiter, _index in session.pending.values():
        if type(waiter) is AddFrame:
            if waiter.deadline <= now:
                waiter.time_out(now)
        elif type(waiter) is BatchFrame and waiter.call.deadline <= now:
            waiter.call.time_out()
    for add in session.add_queue:
        if add.call.deadline <= now:
            add.call.time_out()


__all__ = ["TIMEOUT_TICK_S", "DeadlineSweeper"]
