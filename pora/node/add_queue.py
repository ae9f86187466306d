"""In-process adds from many tasks, submitted to the journal once per scheduler turn.

Each `node.add_entry` call alone would be one journal batch, one record and one
ledger apply. Here the calls of one turn are queued; the first caller of the turn
(its leader) yields once, so that the other tasks running in the same turn queue
theirs, then submits them all: each ledger's adds by entry id, consecutive ones
(same key and flags) as one run request (`entry_runs`, the served node's path).
Every caller parks once (`journal.parking.OneParked`, the parker the per-node
client uses too) and is rescheduled by its entry's completion, with its own
outcome raised in it (an entry of a run that fails alone fails only its caller).
`add_batch` calls, already runs, share the turn's submission as they are.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable

import trio

from journal.errors import PoraError
from journal.parking import OneParked
from journal.request import Add, Request, entry_runs

__all__ = ["AddQueue"]

Submit = Callable[[list[Request]], Awaitable[None]]
Refusal = Callable[[Add], PoraError | None]

#: an Add's ledger and entry id: a turn's adds are sorted by them (C key function)
_ledger_and_entry = operator.itemgetter(1, 2)


class _ParkedAdd(OneParked):
    """The caller of one `add` of a turn, parked until its entry completes."""

    __slots__ = ("_task", "_woken", "error")

    def __init__(self) -> None:
        self._task = None
        self._woken = False
        #: the add's error once it failed (for the turn's leader, which finds its
        #: outcome after submitting rather than parked)
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None) -> None:
        self.error = error
        self._wake(error)


class _Turn:
    """The adds queued in one scheduler turn and their callers."""

    __slots__ = ("adds", "parked", "requests")

    def __init__(self) -> None:
        #: `add_entry` calls, as `Add` tuples tagged with their index here
        self.adds: list[Add] = []
        #: per tag, the caller waiting for that add
        self.parked: list[_ParkedAdd] = []
        #: requests of `add_batch` calls, each completing its caller itself
        self.requests: list[Request] = []

    def on_done(self, run: Request) -> None:
        """A run of the turn's adds completed: wake each of its callers."""
        parked = self.parked
        if run.error is None and run.entry_errors is None:
            for tag in run.tags:
                parked[tag]._wake()
            return
        for index, tag in enumerate(run.tags):
            parked[tag].settle(run.error_of(index))


class Completion(OneParked):
    """Parks one task until every request given completed: the last completion
    reschedules it (cheaper than an Event per request: this is part of the per-add
    cost of in-process writers). Requests refused at submission complete before
    the task parks, and it then does not park."""

    __slots__ = ("_pending", "_task", "_woken")

    def __init__(self, requests: list[Request]) -> None:
        self._task = None
        self._woken = False
        self._pending = len(requests)
        for request in requests:
            request.on_done = self._one_done

    def _one_done(self, _request: Request) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._wake()

    async def wait(self) -> None:
        """Until every request completed. Cancelling the wait does not cancel the
        requests: like a timeout on any database, the caller then does not know
        whether they were performed."""
        if not self._pending:
            # a schedule point all the same, as every call that submits has
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self._park()


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
        elif len(turn.parked) + len(turn.requests) >= self._queued_max:
            return self._add_when_room(
                ledger_id, entry_id, last_add_confirmed, master_key, payload, recovery
            )
        parked = turn.parked
        tag = len(parked)
        caller = _ParkedAdd()
        parked.append(caller)
        turn.adds.append(
            (tag, ledger_id, entry_id, last_add_confirmed, master_key, payload, recovery)
        )
        if tag == 0 and not turn.requests:
            return self._lead(turn, caller)
        return caller._park()

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

    async def _lead(self, turn: _Turn, caller: _ParkedAdd) -> None:
        """The add that opened `turn`: submit the turn, then wait for its own outcome
        (known already when it was refused, or completed during the submission)."""
        await self._submit_turn(turn)
        if caller._woken:
            if caller.error is not None:
                raise caller.error
            return
        await caller._park()

    async def perform(self, requests: list[Request]) -> None:
        """Queue `requests` (runs of one `add_batch`) and wait until every one of them
        has completed; cancellation as for `add`."""
        await trio.lowlevel.checkpoint_if_cancelled()
        turn = await self._current_turn()
        completion = Completion(requests)
        leader = not turn.parked and not turn.requests
        turn.requests += requests
        if leader:
            await self._submit_turn(turn)
        await completion.wait()

    async def _current_turn(self) -> _Turn:
        turn = self._turn
        while turn is not None and len(turn.parked) + len(turn.requests) >= self._queued_max:
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
            turn.parked[tag].settle(refusal)
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
