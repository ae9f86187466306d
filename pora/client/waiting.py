"""How the client's callers wait, the cheapest way of the running event loop.

Every append, add and request parks its caller once, so the waiter is part of the
per-call cost: anyio's `Event` over trio costs several times what a task parked and
rescheduled directly does. This module is the one place that looks at which event
loop runs (`trio_running`, through sniffio) and picks the waiter:

- `event_factory`: an event any number of tasks wait on (a writer's appends):
  `TrioEvent` under trio, `asyncio.Event` under asyncio, else anyio's.
- `wakeup_factory`: an event with one waiter (a request's caller): `TrioWakeup`
  under trio, else anyio's.
- `TrioWakeup` and `coalescer.ParkedAddCall` park their task on themselves under
  trio, with `journal.parking.OneParked` (the one parker the node's in-process
  adds use too).
- `trio_running`: for waiters that park on themselves.

Call the factories in a task, once per client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import sniffio
import trio

from journal.parking import OneParked


class Event(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    def wait(self) -> Awaitable[object]: ...


def trio_running() -> bool:
    """Whether the task calling this runs under trio."""
    return sniffio.current_async_library() == "trio"


class TrioEvent:
    """A one-shot event under trio, for any number of waiters: each parks itself and
    `set` reschedules them all (no parking lot, no anyio wrapper).

    A waiter marks itself as parked here with trio's `Task.custom_sleep_data` (which
    trio clears whenever it reschedules the task), so one abort function serves every
    wait: a cancelled waiter stays in the list, unmarked, and `set` skips it. No
    closure is made per wait (one per append: the appends of a turn wait on one)."""

    __slots__ = ("_flag", "_tasks")

    def __init__(self) -> None:
        self._flag = False
        self._tasks: list[trio.lowlevel.Task] = []

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            # (a task listed twice, cancelled and parked here again, is woken once:
            # the first reschedule clears its mark)
            if task.custom_sleep_data is self:
                trio.lowlevel.reschedule(task)

    def is_set(self) -> bool:
        return self._flag

    def wait(self) -> Awaitable[object]:
        """What to await: trio's own trap, not a coroutine of this method's (a level
        of coroutines more is resumed at every wake-up, once per append)."""
        if self._flag:
            return trio.lowlevel.checkpoint()  # noqa: ASYNC105 (awaited by the caller)
        task = trio.lowlevel.current_task()
        task.custom_sleep_data = self
        self._tasks.append(task)
        return trio.lowlevel.wait_task_rescheduled(_abort_wait)  # noqa: ASYNC105 (as above)


def _abort_wait(_raise_cancel: object) -> trio.lowlevel.Abort:
    """A `TrioEvent` waiter is cancelled: trio reschedules it, which clears its mark
    (`custom_sleep_data`), so `set` passes it by."""
    return trio.lowlevel.Abort.SUCCEEDED


class TrioWakeup(OneParked):
    """An event with one waiter, under trio (see `OneParked`)."""

    __slots__ = ("_task", "_woken")

    def __init__(self) -> None:
        self._woken = False
        self._task = None

    set = OneParked._wake
    wait = OneParked._park

    def is_set(self) -> bool:
        return self._woken


def event_factory() -> Callable[[], Event]:
    """The event type for any number of waiters, for the event loop running now."""
    library = sniffio.current_async_library()
    if library == "trio":
        return TrioEvent
    if library == "asyncio":
        return asyncio.Event
    return anyio.Event


def wakeup_factory() -> Callable[[], Event]:
    """The cheapest one-waiter event of the running event loop: under trio, a task
    parked and rescheduled directly (anyio's wrapper of trio.Event costs ten times
    as much, once per request)."""
    if trio_running():
        return TrioWakeup
    return anyio.Event


__all__ = [
    "Event",
    "TrioEvent",
    "TrioWakeup",
    "event_factory",
    "trio_running",
    "wakeup_factory",
]
