"""In-process adds from many tasks, submitted to the journal once per scheduler turn.

Each `node.add_entry` call alone would be one journal batch, one record and one
ledger apply. Here the calls of one turn are queued; the first caller of the turn
(its leader) yields once, so that the other tasks running in the same turn queue
theirs, then submits them all: each ledger's adds by entry id, consecutive ones
(same key and flags) as one run request (`entry_runs`, the served node's path).
Every caller parks once and is rescheduled by its entry's completion, with its own
outcome raised in it (an entry of a run that fails alone fails only its caller).
`add_batch` calls, already runs, share the turn's submission as they are.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable

import outcome
import trio

from journal.errors import PoraError
from journal.request import Add, Request, entry_runs

__all__ = ["AddQueue"]

Submit = Callable[[list[Request]], Awaitable[None]]
Refusal = Callable[[Add], PoraError | None]

#: an Add's ledger and entry id: a turn's adds are sorted by them (C key function)
_ledger_and_entry = operator.itemgetter(1, 2)


class _Turn:
    """The adds queued in one scheduler turn and their callers."""

    __slots__ = ("adds", "early", "requests", "tasks")

    def __init__(self) -> None:
        #: `add_entry` calls, as `Add` tuples tagged with their index here
        self.adds: list[Add] = []
        #: per tag, the caller's task while it is parked (None: not parked)
        self.tasks: list[trio.lowlevel.Task | None] = []
        #: outcomes that came before their caller parked (the leader's, refusals)
        self.early: dict[int, BaseException | None] = {}
        #: requests of `add_batch` calls, each completing its caller itself
        self.requests: list[Request] = []

    def settle(self, tag: int, error: BaseException | None) -> None:
        task = self.tasks[tag]
        if task is None:
            self.early[tag] = error
            return
        self.tasks[tag] = None
        trio.lowlevel.reschedule(
            task, outcome.Value(None) if error is None else outcome.Error(error)
        )

    def on_done(self, run: Request) -> None:
        """A run of the turn's adds completed: wake each of its callers."""
        tasks = self.tasks
        if run.error is None and run.entry_errors is None:
            for tag in run.tags:
                task = tasks[tag]
                if task is None:
                    self.early[tag] = None
                else:
                    tasks[tag] = None
                    trio.lowlevel.reschedule(task)
            return
        for index, tag in enumerate(run.tags):
            self.settle(tag, run.error_of(index))


class Completion:
    """Parks one task until every request given completed: the last completion
    reschedules it (cheaper than an Event per request: this is part of the per-add
    cost of in-process writers). Requests refused at submission complete before
    the task parks, and it then does not park."""

    __slots__ = ("_parked", "_pending", "_task")

    def __init__(self, requests: list[Request]) -> None:
        self._task = trio.lowlevel.current_task()
        self._pending = len(requests)
        self._parked = False
        for request in requests:
            request.on_done = self._one_done

    def _one_done(self, _request: Request) -> None:
        self._pending -= 1
        if self._pending == 0 and self._parked:
            trio.lowlevel.reschedule(self._task)

    async def wait(self) -> None:
        """Until every request completed. Cancelling the wait does not cancel the
        requests: like a timeout on any database, the caller then does not know
        whether they were performed."""
        if not self._pending:
            # a schedule point all the same, as every call that submits has
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        self._parked = True
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._parked = False
        return trio.lowlevel.Abort.SUCCEEDED


class AddQueue:
    """The current turn's adds, and who submits them.

    Bounded: at most `queued_max` adds and requests wait for a turn's submission (a
    caller beyond that waits for the next turn); a submission waits while the
    journal's channel is full, as a direct submission does.
    """

    def __init__(
        self, submit: Submit, entry_bytes_max: int, refusal: Refusal, queued_max: int
    ) -> None:
        self._submit = submit
        self._entry_bytes_max = entry_bytes_max
        self._refusal = refusal
        self._queued_max = queued_max
        self._turn: _Turn | None = None
        self._space: trio.Event | None = None

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        last_add_confirmed: int,
        master_key: bytes,
        payload: bytes,
        recovery: bool,
    ) -> Awaitable[None]:
        """Queue one checked add; awaiting what this returns waits until the add is
        stored (or raises its error). The caller has passed a cancellation point
        (`checkpoint_if_cancelled`) just before: a caller cancelled by then queues
        nothing.

        Not a coroutine itself: most callers are parked by the awaitable returned,
        and every level of coroutines would be resumed again at each wake-up.
        Cancelling the wait does not cancel the add (it is submitted with its
        turn's): like a timeout on any database, the caller then does not know
        whether it was stored.
        """
        turn = self._turn
        if turn is None:
            turn = self._turn = _Turn()
        elif len(turn.tasks) + len(turn.requests) >= self._queued_max:
            return self._add_when_room(
                ledger_id, entry_id, last_add_confirmed, master_key, payload, recovery
            )
        tasks = turn.tasks
        tag = len(tasks)
        turn.adds.append(
            (tag, ledger_id, entry_id, last_add_confirmed, master_key, payload, recovery)
        )
        if tag == 0 and not turn.requests:
            tasks.append(None)
            return self._lead(turn, tag)
        tasks.append(trio.lowlevel.current_task())

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            tasks[tag] = None
            return trio.lowlevel.Abort.SUCCEEDED

        return trio.lowlevel.wait_task_rescheduled(abort)  # noqa: ASYNC105 (awaited by the caller)

    async def _add_when_room(
        self,
        ledger_id: int,
        entry_id: int,
        last_add_confirmed: int,
        master_key: bytes,
        payload: bytes,
        recovery: bool,
    ) -> None:
        await self._current_turn()
        await self.add(ledger_id, entry_id, last_add_confirmed, master_key, payload, recovery)

    async def _lead(self, turn: _Turn, tag: int) -> None:
        """The add that opened `turn`: submit the turn, then wait for its own outcome."""
        await self._submit_turn(turn)
        if tag in turn.early:
            error = turn.early[tag]
            if error is not None:
                raise error
            return
        tasks = turn.tasks
        tasks[tag] = trio.lowlevel.current_task()

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            tasks[tag] = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def perform(self, requests: list[Request]) -> None:
        """Queue `requests` (runs of one `add_batch`) and wait until every one of them
        has completed; cancellation as for `add`."""
        await trio.lowlevel.checkpoint_if_cancelled()
        turn = await self._current_turn()
        completion = Completion(requests)
        leader = not turn.tasks and not turn.requests
        turn.requests += requests
        if leader:
            await self._submit_turn(turn)
        await completion.wait()

    async def _current_turn(self) -> _Turn:
        turn = self._turn
        while turn is not None and len(turn.tasks) + len(turn.requests) >= self._queued_max:
            if self._space is None:
                self._space = trio.Event()
            await self._space.wait()
            turn = self._turn
        if turn is None:
            turn = self._turn = _Turn()
        return turn

    async def _submit_turn(self, turn: _Turn) -> None:
        """The leader of a turn: let the turn's other callers queue, then submit
        everything queued. Shielded: the others' adds depend on it."""
        await trio.lowlevel.cancel_shielded_checkpoint()
        self._turn = None
        if self._space is not None:
            self._space.set()
            self._space = None
        adds = turn.adds
        if len(adds) > 1:
            adds.sort(key=_ledger_and_entry)  # stable: one id twice keeps its order
        batch, refused = entry_runs(adds, self._entry_bytes_max, turn.on_done, self._refusal)
        for tag, refusal in refused:
            turn.settle(tag, refusal)
        if turn.requests:
            batch += turn.requests
        try:
            with trio.CancelScope(shield=True):
                await self._submit(batch)
        except BaseException as error:
            # nothing of the batch reached the journal: each caller gets the reason
            # (requests refused at the door were failed already)
            for request in batch:
                if request.error is None:
                    request.fail(error)
            if not isinstance(error, Exception):
                raise
