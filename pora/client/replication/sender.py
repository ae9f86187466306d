"""A ledger writer's sender (R3, R4, R8, R13): one task that wakes once per scheduler
turn, takes every entry queued since the last turn and makes ONE `add_entries` call
per member of the ensemble, without waiting for the previous turn's answers (up to
`calls_in_flight_per_node_max` calls per node in flight). Answers are counted in
bulk (`AckTracker.record_acks`); a failed call fails the member (the ensemble
changer's business), a refusal of the ledger ends the writer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import anyio.abc

from journal.errors import PoraError
from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerFenced,
    Unauthorized,
)
from pora.client.replication.ensemble_change import EnsembleChanger, WriterContext
from pora.client.replication.quorum import AckTracker
from pora.meta.records import EnsembleMember

_log = logging.getLogger("pora.client.writer")

Batch = list[tuple[int, bytes]]


class Sender:
    def __init__(
        self,
        ledger_id: int,
        context: WriterContext,
        tracker: AckTracker,
        entries: dict[int, tuple[bytes, int]],
        master_key: bytes,
        changer: EnsembleChanger,
        fail: Callable[[PoraError], None],
        acknowledged: Callable[[range], None],
        end_turn: Callable[[], None],
    ) -> None:
        self._ledger_id = ledger_id
        self._context = context
        self._tracker = tracker
        self._entries = entries  # the writer's pending entries: id -> (entry, length_after)
        self._master_key = master_key
        self._changer = changer
        self._fail = fail
        self._acknowledged = acknowledged
        self._end_turn = end_turn
        #: ids added and not yet taken by a turn; the writer appends to it
        self.outbox: list[int] = []
        self._resends: list[tuple[EnsembleMember, Batch]] = []
        self._wake = anyio.Event()
        self._slots: dict[EnsembleMember, anyio.Semaphore] = {}
        self._in_flight = 0  # add calls started and not finished
        self._calls_done = anyio.Event()
        #: add calls answered so far (the LAC flush's measure of idleness)
        self.answered = 0
        #: the highest LAC a node was sent, piggybacked or flushed (R4, R7)
        self.lac_sent = -1

    def wake(self) -> None:
        """Run a turn soon (at most one per scheduler turn however often it is asked)."""
        if not self._wake.is_set():
            self._wake.set()

    def queue_resend(self, member: EnsembleMember, entry_ids: Sequence[int]) -> None:
        """R10: pending entries a replacement must be sent (those still in the outbox go
        out with their turn, to the new ensemble)."""
        first_unsent = self.outbox[0] if self.outbox else self._tracker.next_entry_id
        entries = [(i, self._entries[i][0]) for i in entry_ids if i < first_unsent]
        if entries:
            self._resends.append((member, entries))

    async def calls_done(self) -> None:
        """Wait until no add call is in flight."""
        if self._in_flight:
            await self._calls_done.wait()

    async def run(self, tasks: anyio.abc.TaskGroup) -> None:
        """The turns, forever; the calls run in `tasks`."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            batch, self.outbox = self.outbox, []
            resends, self._resends = self._resends, []
            self._end_turn()
            if not self._tracker.fenced:
                self._dispatch(batch, resends, tasks)

    def _dispatch(
        self,
        batch: list[int],
        resends: list[tuple[EnsembleMember, Batch]],
        tasks: anyio.abc.TaskGroup,
    ) -> None:
        tracker = self._tracker
        members = tracker.ensemble.members
        size, quorum = len(members), tracker.write_quorum
        failed = tracker.failed_members
        entries = self._entries
        everything = [(i, entries[i][0]) for i in batch]
        for member, resent in resends:
            if member in members and member not in failed:
                self._start(tasks, member, resent)
        if not everything:
            return
        for position, member in enumerate(members):
            if member in failed:
                continue  # its entries go to its replacement (R10)
            if quorum == size:
                mine = everything
            else:  # R3: position p holds entry i when (p - i) mod E < Qw
                mine = [item for item in everything if (position - item[0]) % size < quorum]
            if mine:
                self._start(tasks, member, mine)

    def _start(self, tasks: anyio.abc.TaskGroup, member: EnsembleMember, entries: Batch) -> None:
        if not self._in_flight:
            self._calls_done = anyio.Event()
        self._in_flight += 1
        tasks.start_soon(self._send_counted, member, entries)

    async def _send_counted(self, member: EnsembleMember, entries: Batch) -> None:
        try:
            await self._send(member, entries)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._calls_done.set()

    async def _send(self, member: EnsembleMember, entries: Batch) -> None:
        slots = self._slots.get(member)
        if slots is None:
            slots = self._slots[member] = anyio.Semaphore(
                self._context.config.calls_in_flight_per_node_max
            )
        async with slots:
            if self._tracker.fenced or member not in self._tracker.ensemble.members:
                return  # replaced meanwhile: the replacement was sent these (R10)
            lac = self._tracker.last_add_confirmed
            outcomes = await self._call_add(member, entries, lac)
        if outcomes is None:
            return
        self.answered += 1
        self.lac_sent = max(self.lac_sent, lac)
        stored: list[int] = []
        for (entry_id, _), outcome in zip(entries, outcomes, strict=True):
            if outcome is not None:
                self._refused(member, outcome)
                return
            stored.append(entry_id)
        self._acknowledged(self._tracker.record_acks(member, stored))

    async def _call_add(
        self, member: EnsembleMember, entries: Batch, lac: int
    ) -> list[PoraError | None] | None:
        """One add call, bounded by `node_timeout_s`; None when the member failed (R8)."""
        timeout_s = self._context.config.node_timeout_s
        failure: BaseException | None = None
        with anyio.move_on_after(timeout_s):
            try:
                channel = await self._context.pool.channel(member.address)
                return await channel.add_entries(
                    self._ledger_id,
                    entries,
                    master_key=self._master_key,
                    last_add_confirmed=lac,
                    instance_id=member.instance_id,
                    timeout_s=timeout_s,
                )
            except (PoraError, OSError) as error:
                failure = error
        self._changer.member_failed(member, failure or TimeoutError(f"no answer in {timeout_s} s"))
        return None

    def _refused(self, member: EnsembleMember, error: PoraError) -> None:
        """R13: a refusal of the ledger ends the writer (FENCED and CLOSED fence it;
        UNAUTHORIZED fails it with that error); a conflicting or oversized entry is a bug
        or a misuse that stops the ledger at that entry; anything else fails the member."""
        if isinstance(error, LedgerClosed):
            # the writer's own close stops its sender before it seals the nodes: a node
            # sealed under a writing writer was sealed by a recovery, which fenced it
            self._fail(LedgerFenced(self._ledger_id))
        elif isinstance(error, LedgerFenced | Unauthorized):
            self._fail(error)
        elif isinstance(error, EntryConflict | EntryTooLarge | InvalidArgument):
            _log.error("ledger %d: node %s refused an entry: %s", self._ledger_id, member, error)
            self._fail(error)
        else:
            self._changer.member_failed(member, error)
