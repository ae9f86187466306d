"""Open-loop load: operations started on a schedule, each at its due time, at a cost
the schedule itself does not dominate, on any event loop anyio runs (trio, asyncio,
uvloop).

Operation i is due at `begin + i / rate`. A driver task waits until the next due
time with a `DeadlineTimer` (a timerfd: an event loop's own sleep wakes up to a
millisecond late, which at 500/s would be most of what a fast system's latency is),
then hands every due time that has come to a pool of worker tasks through one
bounded channel, each unparking one worker. A task spawned per operation would cost
tens of microseconds each. A worker runs the operation with its due time (latency is
measured from the due time, so a late start counts against it: no coordinated
omission) and waits for the next. Workers are added when none is idle, up to
`workers_max`; beyond that the due times wait in the channel (at most `workers_max`
of them, then the driver waits too), and their lateness still counts.

A wake-up per start costs the generator's process more CPU than a 1 ms tick's
batches (tasks that only checkpoint, on a loaded 2-core machine: 60-90 against
20-35 us a start at 4,000-8,000/s; alike at 500/s); spacing the wake-ups 0.5 ms
apart saved a fifth of that and made starts late by 0.4-0.9 ms again. Both systems
measured pay the same generator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from pora.bench.deadline_timer import DeadlineTimer

__all__ = ["run_on_schedule"]

#: the most operations in flight at once (and due times queued for a free worker)
WORKERS_MAX = 4096


async def run_on_schedule(
    rate: float,
    operation: Callable[[float], Awaitable[None]],
    *,
    total: int | None = None,
    until: Callable[[], bool] | None = None,
    workers_max: int = WORKERS_MAX,
) -> int:
    """Start `operation(due)` `rate` times a second, `due` being its scheduled start
    on `time.perf_counter()`'s clock, until `total` were started or `until()` holds;
    returns once every started operation ended, with how many were started."""
    if total is None and until is None:
        raise ValueError("run_on_schedule needs a total or an until condition")
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"run_on_schedule needs a finite rate > 0, not {rate}")
    send_due, receive_due = anyio.create_memory_object_stream[float](workers_max)
    #: due times handed out and not yet done (queued, or their operation running)
    busy = 0

    async def worker(receive: MemoryObjectReceiveStream[float]) -> None:
        nonlocal busy
        with receive:
            async for due in receive:
                try:
                    await operation(due)
                finally:
                    busy -= 1

    started = 0
    workers = 0
    async with anyio.create_task_group() as tasks:
        with send_due, receive_due, DeadlineTimer() as timer:
            begin = time.perf_counter()
            while not ((total is not None and started >= total) or (until is not None and until())):
                await timer.wait_until(begin + started / rate)
                come_due = int((time.perf_counter() - begin) * rate) + 1
                if total is not None:
                    come_due = min(total, come_due)
                for index in range(started, come_due):
                    if busy >= workers and workers < workers_max:  # no worker free
                        tasks.start_soon(worker, receive_due.clone())
                        workers += 1
                    busy += 1
                    try:
                        send_due.send_nowait(begin + index / rate)
                    except anyio.WouldBlock:  # workers_max busy and as many queued
                        await send_due.send(begin + index / rate)
                started = come_due
    return started
