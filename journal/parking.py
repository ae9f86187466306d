"""`OneParked`: one task parked under trio on the object it waits for, until that
object wakes it, once: rescheduled directly, without the parking lot of a
`trio.Event` and without a closure per wait.

The cheapest wait trio offers, and one per call on the hottest paths of both ends:
every in-process add of the node (`pora.node.add_queue`) and every call of the
per-node client (`pora.client.waiting.TrioWakeup`, `pora.client.coalescer`) parks
its caller once. It lives in this lowest room so that both use the one parker; it
imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

import outcome
import trio


class OneParked:
    """Mixed into what a task waits on, which holds the two slots `_task` and
    `_woken` (both start None and False): `_park` parks the calling task on it,
    `_wake` reschedules that task, once. A wake that comes
    before the park leaves the object woken, and the park then returns at once."""

    if not TYPE_CHECKING:  # (mypy would refuse the slots its subclasses hold)
        __slots__ = ()

    _task: trio.lowlevel.Task | None
    _woken: bool

    def _wake(self, error: BaseException | None = None) -> None:
        """Reschedule the parked task, with `error` raised in it if given. A task not
        parked yet is not told the error: its holder keeps it for it to find."""
        if self._woken:
            return
        self._woken = True
        task = self._task
        if task is not None:
            self._task = None
            if error is None:
                trio.lowlevel.reschedule(task)
            else:
                trio.lowlevel.reschedule(task, outcome.Error(error))

    def _park(self) -> Awaitable[None]:
        """What to await: trio's trap itself, not a coroutine of this method's (a
        level of coroutines more is resumed at every wake-up)."""
        if self._woken:
            return trio.lowlevel.checkpoint()  # noqa: ASYNC105 (awaited by the caller)
        if self._task is not None:
            raise RuntimeError(f"a {type(self).__name__} has one waiter at most")
        self._task = trio.lowlevel.current_task()
        return trio.lowlevel.wait_task_rescheduled(self._abort)  # noqa: ASYNC105 (as above)

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        """The parked task is cancelled: a later wake finds nobody to reschedule."""
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED


__all__ = ["OneParked"]
