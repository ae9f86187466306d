"""`LedgerWriter`: a ledger's write path (docs/replication.md R4..R15).

The ledger's pending adds are one pure state machine, `PendingAdds`
(`core/pending_adds.py`): ids, encoded entries, batches, acknowledgements, the LAC.
The writer does the I/O around it: room in the ledger's and the client's bounds,
the appends' waiters, and the ledger's side of the client's node calls
(`pora/client/node_calls.py`, set up by `backlog.py`): it is the `NodeCaller`
whose turns and answers they carry. Cheap per append: `append` takes room, hands
the payload to `PendingAdds.add` (the next id, the entry encoded) and asks the node
calls for a turn; the entries no turn took yet share one waiter. The node calls'
dispatch takes the ledger's turn once per scheduler turn (`take_turn`: the batches
`PendingAdds.take_batches` returns, one per member, R3, plus the resends of a
replacement, R10), and each node gets ONE call per turn carrying every ledger's
batch for it. A turn never waits for the previous turn's answers: several calls per
node may be in flight (`calls_in_flight_per_node_max`). A call's answers come back
as plain calls (`answer`), from the connection's reader; what they acknowledge
comes back from `PendingAdds.acked` as one `Released` range, which completes its
waiters in one pass.

Failures (R8: a failed call, an overflowed backlog) go to one ensemble-change task
per ledger (R9..R12), one change at a time; refusals (R13, sorted by
core/refusals.py) end the writer. The changer tells the writer outcomes only
(`WriterOutcomes`: appends acknowledged, the writer failed).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from journal.errors import PoraError
from ledger.errors import (
    EntryTooLarge,
    LedgerClosed,
    LedgerDeleted,
    LedgerFenced,
)
from netio.budget import Budget
from pora.client.node_channel import AddAnswer, AddRequest
from pora.client.replication.core.ledger_records import why_fenced
from pora.client.replication.core.pending_adds import Batch, PendingAdds, Released
from pora.client.replication.core.refusals import EndWriter, first_refusal, sort_refusal
from pora.client.replication.ensemble_change import EnsembleChanger, WriterContext
from pora.client.replication.errors import ClientClosed
from pora.client.waiting import Event
from pora.meta.errors import MetadataError, NoSuchLedgerMetadata
from pora.meta.records import EnsembleMember, LedgerMetadata, Versioned

_log = logging.getLogger("pora.client.writer")


@dataclass(eq=False, slots=True)
class _TurnWaiter:
    """The entries one turn takes, up to `last`, wait on one event; `acknowledged`
    once they all are (else the event was set because the writer failed)."""

    last: int
    event: Event
    #: when the turn's first append was made (metrics' clock; set only with metrics)
    started: float = 0.0
    acknowledged: bool = False


class LedgerWriter:
    def __init__(
        self, context: WriterContext, record: Versioned[LedgerMetadata], master_key: bytes
    ) -> None:
        metadata = record.value
        self.ledger_id = metadata.ledger_id
        self._context = context
        self._master_key = master_key  # sent with every add (`add_request`)
        self._node_calls = context.node_calls
        config = context.config
        self._adds = PendingAdds.of_ledger(metadata, call_bytes_max=config.add_call_bytes_max)
        self._changer = EnsembleChanger(context, record, self._adds, self)
        self._payload_max = config.payload_bytes_max
        self._room = Budget(
            config.pending_appends_per_ledger_max,
            f"ledger {self.ledger_id}'s pending appends",
            context.new_event,
        )
        self._waiters: deque[_TurnWaiter] = deque()
        self._lac_dirty = anyio.Event()
        self._turn_due = False  # a turn is asked for: the node calls' next dispatch
        self._sending = True  # until the writer stops: then no turns, answers ignored
        self._calls_in_flight = 0  # batches submitted and not finished with
        self._calls_done: anyio.Event | None = None  # made only when a close waits
        self._error: PoraError | None = None
        self._closing = False
        self._closed = False
        self._close_lock = anyio.Lock()
        self._scope: anyio.CancelScope | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        #: set while a fenced writer re-reads the record to learn why (R26): the
        #: appends failing wait for it, so they fail with LedgerDeleted after a delete
        self._cause_known: anyio.Event | None = None
        self._stopped = anyio.Event()
        self._on_closed: Callable[[LedgerWriter], None] = lambda writer: None

    # -- the application's side ---------------------------------------------------------

    @property
    def last_add_confirmed(self) -> int:
        """R4: the highest id acknowledged with every one before it (-1: none)."""
        return self._adds.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's record as this writer last wrote or read it."""
        return self._changer.record.value

    async def __aenter__(self) -> LedgerWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def append(self, payload: bytes) -> int:
        """Append one entry; returns its id once Qa nodes of its write set hold it and
        every earlier entry is acknowledged (R4). Waits for room when the ledger's or
        the client's pending bounds are reached."""
        if self._error is not None or self._closing:
            await self._cause()
            self._check_writable()
        size = len(payload)
        if size > self._payload_max:
            self._check_size(payload)
        if not self._try_reserve(1, size):
            await self._reserve(1, size)
        waiter = self._add(payload)
        entry_id = waiter.last  # (the entry just added is its waiter's last)
        await waiter.event.wait()
        # woken by a failure, the entry may still be acknowledged (before the others)
        if waiter.acknowledged or entry_id <= self._adds.last_add_confirmed:
            return entry_id
        assert self._error is not None
        raise self._error

    async def append_many(self, payloads: Sequence[bytes]) -> list[int]:
        """Append entries in order; returns their ids once all are acknowledged. A
        payload over the limit refuses the whole call before any is appended."""
        for payload in payloads:
            self._check_size(payload)
        ids: list[int] = []
        last: _TurnWaiter | None = None
        step = self._room.limit
        for start in range(0, len(payloads), step):
            chunk = payloads[start : start + step]
            await self._cause()
            self._check_writable()
            await self._reserve(len(chunk), sum(len(p) for p in chunk))
            for payload in chunk:
                last = self._add(payload)
                ids.append(last.last)
        if last is None:
            return ids
        await last.event.wait()
        if last.acknowledged or ids[-1] <= self._adds.last_add_confirmed:
            return ids
        assert self._error is not None
        raise self._error

    def _check_size(self, payload: bytes) -> None:
        """A payload no node would take is refused here, before it has an id: the
        ledger goes on (a node refusing it would end the writer)."""
        limit = self._context.config.payload_bytes_max
        if len(payload) > limit:
            raise EntryTooLarge(self.ledger_id, len(payload), limit)

    async def close(self) -> None:
        """R14: wait for the pending appends, set the record CLOSED at the LAC with the
        ledger's length (R11 on a conflict: LedgerFenced), then seal the last
        ensemble's nodes (best effort). Closing a closed writer returns. When the
        record's write fails (the store unreachable, a timeout), the error propagates
        and the writer stays closing: appends are refused, and `close()` again retries
        (finding the record already closed at its LAC when the failed write took)."""
        async with self._close_lock:
            if self._closed:
                return
            self._closing = True
            while self._waiters:
                await self._waiters[-1].event.wait()
            await self._cause()
            if isinstance(self._error, LedgerFenced):
                # a recovery owns the record now: the writer must not write it (R11)
                await self._end()
                raise self._error
            # the Qw - Qa replicas still being written get their copies (bounded)
            with anyio.move_on_after(self._context.config.node_timeout_s):
                await self._calls_finished()
            try:
                await self._changer.close_record(
                    self._adds.last_add_confirmed, self._adds.acked_length
                )
            except LedgerFenced:
                await self._end()
                raise
            await self._end()
            await self._changer.seal(self._adds.last_add_confirmed, self._master_key)

    async def _end(self) -> None:
        """The writer is done with its record: the client forgets it, its tasks stop."""
        self._closed = True
        self._on_closed(self)
        await self._stop()

    # -- the client's side --------------------------------------------------------------

    async def start(
        self, task_group: anyio.abc.TaskGroup, on_closed: Callable[[LedgerWriter], None]
    ) -> None:
        """Run the ledger's ensemble changer and LAC flusher in `task_group` (its adds go
        through the client's node calls); `on_closed(self)` once closed."""
        self._on_closed = on_closed
        await task_group.start(self._run)

    async def abandon(self) -> None:
        """The client ends: pending and later appends fail with ClientClosed; the
        writer's tasks stop (the ledger stays open: a recovery closes it)."""
        if self._waiters:
            self.writer_failed(ClientClosed(self.ledger_id))
        elif self._error is None:  # nothing pending: nothing to report
            self._error = ClientClosed(self.ledger_id)
            self._adds.fence()
        self._closed = True
        await self._stop()

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                self._scope = tasks.cancel_scope
                self._tasks = tasks
                tasks.start_soon(self._changer.run, self._wake_turn)
                tasks.start_soon(self._lac_flush_loop)
                task_status.started()
        finally:
            self._stopped.set()

    async def _stop(self) -> None:
        self._sending = False
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()

    # -- adding -------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosed(self.ledger_id)

    def _try_reserve(self, count: int, size: int) -> bool:
        """Take room for `count` appends of `size` bytes when both bounds have it now:
        a plain call, not a coroutine, on the append fast path (docs/performance.md)."""
        if not self._room.try_take(count):
            return False
        if not self._context.pending_bytes.try_take(size):
            self._room.give(count)
            return False
        return True

    async def _reserve(self, count: int, size: int) -> None:
        if not self._room.try_take(count):
            await self._room.take(count)
        pending_bytes = self._context.pending_bytes
        if not pending_bytes.try_take(size):
            try:
                await pending_bytes.take(size)
            except BaseException:
                self._room.give(count)
                raise
        if self._error is not None or self._closing:
            self._room.give(count)
            pending_bytes.give(size)
            await self._cause()
            self._check_writable()

    def _add(self, payload: bytes) -> _TurnWaiter:
        """Add the entry; returns the waiter it shares, whose `last` it is now."""
        adds = self._adds
        entry_id = adds.add(payload)
        if entry_id == adds.first_untaken:  # the first of the next turn: a new waiter
            turn = _TurnWaiter(entry_id, self._context.new_event())
            if self._context.metrics is not None:
                turn.started = self._context.metrics.clock()
            self._waiters.append(turn)
        else:  # the untaken entries before it share the last waiter
            turn = self._waiters[-1]
            turn.last = entry_id
        if not self._turn_due:  # (tested here too: no call for the turn's later appends)
            self._wake_turn()
        return turn

    def _wake_turn(self) -> None:
        """Take a turn in the node calls' next dispatch (at most one per turn)."""
        if not self._turn_due:
            self._turn_due = True
            self._node_calls.schedule(self)

    async def _calls_finished(self) -> None:
        """Wait until no add call of this ledger is in flight."""
        if self._calls_in_flight:
            if self._calls_done is None:
                self._calls_done = anyio.Event()
            await self._calls_done.wait()

    # -- the node calls' side (node_calls.NodeCaller) -------------------------------------

    def take_turn(self) -> None:
        """Hand the turn's batches to the node calls."""
        self._turn_due = False
        if not self._sending:
            return
        node_calls = self._node_calls
        for member, entries, size in self._adds.take_batches():
            self._calls_in_flight += 1
            node_calls.submit(self, member, entries, size)

    def sends_to(self, member: EnsembleMember) -> bool:
        return self._sending and self._adds.sends_to(member)

    def issued_lac(self) -> int:
        return self._adds.last_add_confirmed

    def add_request(self, entries: Batch) -> AddRequest:
        return AddRequest(self.ledger_id, entries, self._master_key, self._adds.last_add_confirmed)

    def answer(self, member: EnsembleMember, entries: Batch, lac: int, answer: AddAnswer) -> None:
        """A call's outcome for this ledger's batch: acknowledgements (R4), a failed
        member (R8) or a refusal (R13)."""
        if not self._sending:
            return
        if isinstance(answer, BaseException):
            self._changer.member_failed(member, answer)  # R8
            return
        adds = self._adds
        if answer is not None:  # an outcome per entry: some entry failed
            refusal = first_refusal(answer)
            if refusal is not None:
                adds.answered(lac)
                self._refused(member, refusal)
                return
        released = adds.acked(member, entries, lac)
        if released.ids:
            self.appends_acknowledged(released)

    def call_finished(self) -> None:
        self._calls_in_flight -= 1
        if not self._calls_in_flight and self._calls_done is not None:
            self._calls_done.set()
            self._calls_done = None

    def _refused(self, member: EnsembleMember, error: PoraError) -> None:
        """Act on R13's sorting of a refusal (core/refusals.py)."""
        verdict = sort_refusal(self.ledger_id, error)
        if isinstance(verdict, EndWriter):
            if verdict.misuse:
                _log.error("ledger %d: node %s refused an entry: %s", self.ledger_id, member, error)
            self.writer_failed(verdict.error)
        else:
            self._changer.member_failed(member, verdict.error)

    # -- outcomes (its answers' and the ensemble changer's: WriterOutcomes) ---------------

    def appends_acknowledged(self, released: Released) -> None:
        """Complete the waiters of an acknowledged range (R4), in one pass."""
        acked = released.ids
        self._room.give(len(acked))
        self._context.pending_bytes.give(released.payload_bytes)
        lac = acked[-1]
        waiters = self._waiters
        metrics = self._context.metrics
        if metrics is not None:
            metrics.acknowledged(len(acked), released.payload_bytes)
            now = metrics.clock()
        while waiters and waiters[0].last <= lac:
            waiter = waiters.popleft()
            waiter.acknowledged = True
            if metrics is not None:
                metrics.turn_acknowledged(waiter.started, now)
            waiter.event.set()
        self._lac_dirty.set()

    def writer_failed(self, error: PoraError) -> None:
        """Every pending and later append fails with `error`; nothing more is
        acknowledged (R11, R12, R13). A fence (LedgerFenced) stops the
        acknowledgements at once, and the appends fail once the record re-read says
        why (R26): LedgerDeleted when a delete fenced the writer."""
        if self._error is not None:
            return
        if isinstance(error, NoSuchLedgerMetadata):  # the record is gone: deleted
            error = why_fenced(self.ledger_id, None)
        self._error = error
        _log.warning("ledger %d: writer stopped: %s", self.ledger_id, error)
        if self._context.metrics is not None:
            self._context.metrics.writer_stopped(error)
        failed = self._adds.fence()
        self._room.give(len(failed.ids))
        self._context.pending_bytes.give(failed.payload_bytes)
        if type(error) is LedgerFenced and self._tasks is not None and not self._stopped.is_set():
            self._cause_known = anyio.Event()
            self._tasks.start_soon(self._learn_why_fenced)
            return
        self._wake_all()

    def _wake_all(self) -> None:
        while self._waiters:
            self._waiters.popleft().event.set()

    async def _learn_why_fenced(self) -> None:
        """R26: re-read the record after a fence; a delete's mark, or no record, makes
        the appends fail with LedgerDeleted (an error reading keeps LedgerFenced)."""
        try:
            record = await self._context.store.read_ledger(self.ledger_id)
            self._error = why_fenced(self.ledger_id, record.value)
        except NoSuchLedgerMetadata:
            self._error = why_fenced(self.ledger_id, None)
        except MetadataError as error:
            _log.info("ledger %d: fenced; the record could not be read: %s", self.ledger_id, error)
        else:
            if isinstance(self._error, LedgerDeleted):
                _log.warning("ledger %d: %s", self.ledger_id, self._error)
        finally:
            self._wake_all()
            if self._cause_known is not None:
                self._cause_known.set()

    async def _cause(self) -> None:
        """Wait until a fenced writer knows why (`_learn_why_fenced`), if it is asking."""
        known = self._cause_known
        if known is not None and not self._stopped.is_set():
            with anyio.move_on_after(self._context.config.node_timeout_s):
                await known.wait()

    # -- R7 -----------------------------------------------------------------------------

    async def _lac_flush_loop(self) -> None:
        interval = self._context.config.lac_flush_interval_s
        adds = self._adds
        while True:
            await self._lac_dirty.wait()
            self._lac_dirty = anyio.Event()
            answered = -1
            while answered != adds.answers:  # idle for a whole interval
                answered = adds.answers
                await anyio.sleep(interval)
            lac = adds.lac_to_flush()
            if lac is not None:
                await self._changer.write_lac(lac, self._master_key)
