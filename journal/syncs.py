"""The journal's fdatasyncs: started at once in a worker thread, their ends
delivered by a callback.

`on_end` is called on the event loop when the sync has ended, and then
`outcome()` gives its seconds or raises its OSError. A callback, not a task
waiting on an event: every add of the group waits for what runs after the sync,
and a task woken by an event runs only in the loop's next batch of tasks; called
from where the end is read, the hand-over runs in this one.
A sync is never abandoned (nothing closes the segment under it).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

if TYPE_CHECKING:
    import outcome  # trio's own dependency: what start_thread_soon delivers

OnEnd = Callable[[], None]


class Syncable(Protocol):
    """What a sync needs of a SegmentWriter."""

    def sync(self) -> None: ...


class Sync(Protocol):
    @property
    def ended(self) -> bool: ...

    def outcome(self) -> float:
        """Once ended: the sync's seconds, or its OSError raised."""
        ...


def _timed_sync(writer: Syncable) -> float:
    started = time.perf_counter()
    writer.sync()
    return time.perf_counter() - started


class SyncInThread:
    """One fdatasync of the journal, started in a worker thread at once.

    `trio.to_thread.run_sync` would start it only when an awaiting task runs, a
    turn of the event loop after the group was written; every add of the group
    waits for that turn. The loop learns of the end by a callback.
    """

    __slots__ = ("_on_end", "_result")

    def __init__(self, writer: Syncable, on_end: OnEnd) -> None:
        self._result: outcome.Outcome[float] | None = None
        self._on_end = on_end
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[float]) -> None:  # in the worker thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._finish, result)

        trio.lowlevel.start_thread_soon(functools.partial(_timed_sync, writer), deliver)

    def _finish(self, result: outcome.Outcome[float]) -> None:
        self._result = result
        self._on_end()

    @property
    def ended(self) -> bool:
        return self._result is not None

    def outcome(self) -> float:
        assert self._result is not None, "the sync has not ended"
        return self._result.unwrap()
