"""Request deadlines of the per-node client, without a cancel scope per request.

A cancel scope with a deadline per request costs more than the rest of a pipelined
add (trio keeps every deadline in a heap). Instead one sweeper task per client,
every TIMEOUT_TICK_S while anything is in flight, times out what has passed its
deadline: a call times out at most one tick late.

Every operation in the connection's pending map carries its deadline
(`pending.PendingOperation`); adds queued and not framed yet carry their call's.
The sweep walks both and calls `time_out` on what is due; nothing is kept per
call besides the deadline itself, so a call costs the sweep no bookkeeping. The
sweeper rests once nothing is left with a deadline, and the next call wakes it.
"""

from __future__ import annotations

import math
from typing import Final, Protocol

import anyio

from pora.client.pending import PendingOperation
from pora.client.session import Session

#: Granularity of request timeouts: a request times out at most this much late.
TIMEOUT_TICK_S: Final = 0.02


class HoldsSession(Protocol):
    """Who owns the connection's session now (`NodeConnection`)."""

    @property
    def session(self) -> Session | None: ...


class DeadlineSweep:
    """The sweeper of one client: `run` for the client's lifetime (`stop` ends it),
    sweeping its connection's session while anything waits on it."""

    __slots__ = ("_connection", "_scope", "_wakeup", "idle")

    def __init__(self, connection: HoldsSession) -> None:
        self._connection = connection
        self._wakeup = anyio.Event()
        #: the sweeper waits for work: `wake` it when something gets a deadline
        self.idle = False
        self._scope = anyio.CancelScope()

    def wake(self) -> None:
        """Something has a deadline: make sure the sweeper runs (callers test
        `idle` first, the cheap case)."""
        if self.idle:
            self.idle = False
            self._wakeup.set()

    async def run(self) -> None:
        with self._scope:
            while True:
                session = self._connection.session
                if session is None or not sweep(session, anyio.current_time()):
                    self._wakeup = anyio.Event()
                    self.idle = True
                    await self._wakeup.wait()
                    continue
                await anyio.sleep(TIMEOUT_TICK_S)

    def stop(self) -> None:
        self._scope.cancel()


def sweep(session: Session, now: float) -> bool:
    """Time out what waits on the connection past its deadline; returns whether
    anything is left with a deadline to watch (an operation whose callers all gave
    up, or the connection's INFO, has none: the sweeper then rests until woken).
    What is due is timed out after the walk of the pending map: a posted call's
    end takes its frames out of the map."""
    watched = False
    due: list[PendingOperation] = []
    for operation, _index in session.pending.values():
        deadline = operation.deadline
        if deadline <= now:
            due.append(operation)
        elif deadline != math.inf:
            watched = True
    for operation in due:
        operation.time_out(now)
        if operation.deadline != math.inf:
            watched = True
    for add in session.add_queue:
        watched = True
        if add.call.deadline <= now:
            add.call.time_out()
    return watched


__all__ = ["TIMEOUT_TICK_S", "DeadlineSweep", "sweep"]
