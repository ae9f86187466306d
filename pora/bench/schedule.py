"""Open-loop load: operations started on a schedule, at a cost the schedule itself
does not dominate.

A task spawned per operation, and the loop woken once per operation, cost a trio
process tens of microseconds each: at a few thousand operations a second that is
most of a core, and the figure would measure the load generator. Here a pool of
worker tasks parks on one parking lot; a driver wakes at most once per `tick_s`,
queues the start times that came due and unparks that many workers. Each worker
takes the oldest due time, runs the operation with it (latency is measured from the
due time, so a late start counts against it) and parks again. Workers are added
when every one is busy, up to `workers_max`; beyond that the due times wait in the
queue, and their lateness still counts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable

import trio

__all__ = ["run_on_schedule"]

#: the driver wakes at most this often (a start is late by at most about this much)
TICK_S = 0.001
#: the most operations in flight at once
WORKERS_MAX = 4096


async def run_on_schedule(
    rate: float,
    operation: Callable[[float], Awaitable[None]],
    *,
    total: int | None = None,
    until: Callable[[], bool] | None = None,
    tick_s: float = TICK_S,
    workers_max: int = WORKERS_MAX,
) -> int:
    """Start `operation(due)` `rate` times a second, `due` being its scheduled start
    on `time.perf_counter()`'s clock, until `total` were started or `until()` holds;
    returns once every started operation ended, with how many were started."""
    if total is None and until is None:
        raise ValueError("run_on_schedule needs a total or an until condition")
    due: deque[float] = deque()
    lot = trio.lowlevel.ParkingLot()
    stopping = False
    workers = 0

    async def worker() -> None:
        while True:
            while due:
                await operation(due.popleft())
            if stopping:
                return
            await lot.park()

    begin = time.perf_counter()
    started = 0
    async with trio.open_nursery() as nursery:
        while not ((total is not None and started >= total) or (until is not None and until())):
            now = time.perf_counter()
            come_due = int((now - begin) * rate) + 1
            if total is not None:
                come_due = min(total, come_due)
            new = come_due - started
            due.extend(begin + index / rate for index in range(started, come_due))
            started = come_due
            idle = len(lot)
            for _ in range(min(new - idle, workers_max - workers)):
                nursery.start_soon(worker)
                workers += 1
            if idle and new:
                lot.unpark(count=min(new, idle))
            next_due = begin + started / rate
            await trio.sleep(max(tick_s, next_due - time.perf_counter()))
        stopping = True
        lot.unpark_all()
    return started
