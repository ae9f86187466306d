"""In-process adds from many tasks, submitted to the journal once per scheduler turn.

Each `node.add_entry` call alone would be one journal batch, one record and one
ledger apply. Here the calls of one turn are queued; the first caller of the turn
yields once, so that the other tasks running in the same turn queue theirs, then
submits them all: each ledger's consecutive single adds (same key and flags) merged
into one run request, in the order they were queued. Every caller parks once and
is rescheduled by its own request's completion, with its own outcome (an entry of a
run that fails alone fails only its caller).
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable

import trio

from journal.format import RecordKind
from journal.request import Request, merged_runs

__all__ = ["AddQueue"]

Submit = Callable[[list[Request]], Awaitable[None]]


class AddQueue:
    """The adds queued in the current turn, and who submits them.

    Bounded: at most `queued_max` requests wait for a turn's submission (a caller
    beyond that waits for the next one); a submission waits while the journal's
    channel is full, as a direct submission does.
    """

    def __init__(self, submit: Submit, queued_max: int) -> None:
        self._submit = submit
        self._queued_max = queued_max
        self._queued: list[Request] = []
        self._space: trio.Event | None = None

    async def perform(self, requests: list[Request]) -> None:
        """Queue `requests` and wait until every one of them has completed.

        Cancelling the wait does not cancel the requests (they are submitted with
        their turn's): like a timeout on any database, the caller then does not know
        whether they were stored.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._queued) >= self._queued_max:
            await self._wait_for_space()
        task = trio.lowlevel.current_task()
        pending = len(requests)
        parked = False  # requests refused at submission complete before we park

        def on_done(_request: Request) -> None:
            nonlocal pending
            pending -= 1
            if pending == 0 and parked:
                trio.lowlevel.reschedule(task)

        for request in requests:
            request.on_done = on_done
        queued = self._queued
        queued += requests
        if len(queued) == len(requests):
            await self._submit_turn()
        if pending:

            def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
                nonlocal parked
                parked = False
                return trio.lowlevel.Abort.SUCCEEDED

            parked = True
            await trio.lowlevel.wait_task_rescheduled(abort)

    async def _wait_for_space(self) -> None:
        if self._space is None:
            self._space = trio.Event()
        await self._space.wait()

    async def _submit_turn(self) -> None:
        """The first caller of a turn: let the turn's other callers queue, then
        submit everything queued. Shielded: the others' adds depend on it."""
        await trio.lowlevel.cancel_shielded_checkpoint()
        turn = self._queued
        self._queued = []
        if self._space is not None:
            self._space.set()
            self._space = None
        batch = coalesced(turn)
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


def coalesced(requests: list[Request]) -> list[Request]:
    """`requests` (in queue order) grouped by ledger, each ledger's in order, with
    each stretch of consecutive single adds merged into one run whose completion
    completes its members with their own outcomes."""
    by_ledger: dict[int, list[Request]] = {}
    for request in requests:
        ledger = by_ledger.get(request.ledger_id)
        if ledger is None:
            by_ledger[request.ledger_id] = [request]
        else:
            ledger.append(request)
    if len(by_ledger) == len(requests):
        return requests  # one request per ledger: nothing to merge
    batch: list[Request] = []
    for ledger_requests in by_ledger.values():
        if len(ledger_requests) == 1:
            batch += ledger_requests
            continue
        singles: list[Request] = []
        for request in ledger_requests:
            if request.count == 1 and request.kind is RecordKind.ENTRY:
                singles.append(request)
                continue
            _merge_into(batch, singles)
            singles = []
            batch.append(request)
        _merge_into(batch, singles)
    return batch


def _merge_into(batch: list[Request], singles: list[Request]) -> None:
    """Append `singles` (single adds of one ledger, in order) to `batch` as runs.

    They are sorted by entry id first (stable: equal ids keep their order): adds of
    one turn were all called before any of them returned, so any order is one the
    callers could have seen, and trio runs a turn's tasks in either order."""
    if not singles:
        return
    if len(singles) > 1:
        singles.sort(key=_entry_id)
    start = 0
    for run in merged_runs(singles):
        count = run.count
        if count > 1:
            run.on_done = _fan_out(singles[start : start + count])
        batch.append(run)
        start += count


_entry_id = operator.attrgetter("entry_id")


def _fan_out(members: list[Request]) -> Callable[[Request], None]:
    def on_done(run: Request) -> None:
        error = run.error
        if error is not None:
            for member in members:
                member.fail(error)
            return
        entry_errors = run.entry_errors
        for index, member in enumerate(members):
            entry_error = None if entry_errors is None else entry_errors[index]
            if entry_error is None:
                member.complete(run.result)
            else:
                member.fail(entry_error)

    return on_done
