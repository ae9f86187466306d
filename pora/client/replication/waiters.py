"""The events a writer's appends park on, the cheapest of the running event loop.

Every append waits once, and at a low rate each turn carries one or two appends, so
the waiter is part of the per-append cost: anyio's `Event` over trio costs several
times what a task parked and rescheduled directly does. `event_factory` picks the
event type once per client (sniffio): under trio a `TrioEvent` (parked tasks,
rescheduled by `set`), under asyncio `asyncio.Event`, else anyio's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import anyio
import sniffio
import trio


class Event(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> object: ...


class TrioEvent:
    """A one-shot event under trio, for any number of waiters: each parks itself and
    `set` reschedules them all (no parking lot, no anyio wrapper)."""

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
            trio.lowlevel.reschedule(task)

    def is_set(self) -> bool:
        return self._flag

    async def wait(self) -> None:
        if self._flag:
            await trio.lowlevel.checkpoint()
            return
        task = trio.lowlevel.current_task()
        self._tasks.append(task)

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            self._tasks.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


def event_factory() -> Callable[[], Event]:
    """The event type for the event loop running now (call it in a task)."""
    library = sniffio.current_async_library()
    if library == "trio":
        return TrioEvent
    if library == "asyncio":
        return asyncio.Event
    return anyio.Event


__all__ = ["Event", "TrioEvent", "event_factory"]
