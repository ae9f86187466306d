"""A ledger writer's sender (R3, R4, R8, R10, R13): the ledger's side of the
client's node senders (`node_senders.py`). Each scheduler turn with work, the
client's dispatch takes this ledger's turn: every entry queued since the last turn,
striped into ONE batch per member of the ensemble (R3), plus the resends of a
replacement (R10), handed to each member's node queue, which carries every ledger's
batch for that node in one call. A turn never waits for the previous turn's
answers. Answers come back as plain calls: counted in bulk
(`AckTracker.record_acks`); a failed call fails the member (the ensemble changer's
business), a refusal of the ledger ends the writer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import anyio

from journal.errors import PoraError
from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerFenced,
    Unauthorized,
)
from pora.client.node_channel import AddAnswer
from pora.client.replication.ensemble_change import EnsembleChanger, WriterContext
from pora.client.replication.entry_format import HEADER_BYTES
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
        #: ids added and not yet taken by a turn, and their entries' bytes; the writer
        #: appends to it and counts them
        self.outbox: list[int] = []
        self.outbox_bytes = 0
        self._resends: list[tuple[EnsembleMember, Batch]] = []
        self._call_bytes_max = context.config.add_call_bytes_max
        self._senders = context.senders
        self._scheduled = False  # a turn is due in the client's next dispatch
        self._stopped = False
        self._in_flight = 0  # batches submitted and not answered
        self._calls_done: anyio.Event | None = None  # made only when a close waits
        #: add calls answered so far (the LAC flush's measure of idleness)
        self.answered = 0
        #: the highest LAC a node was sent, piggybacked or flushed (R4, R7)
        self.lac_sent = -1

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def master_key(self) -> bytes:
        return self._master_key

    def wake(self) -> None:
        """Take a turn soon (at most one per scheduler turn however often it is asked)."""
        if not self._scheduled:
            self._scheduled = True
            self._senders.schedule(self)

    def stop(self) -> None:
        """The writer stopped: no more turns, late answers are ignored."""
        self._stopped = True

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
            if self._calls_done is None:
                self._calls_done = anyio.Event()
            await self._calls_done.wait()

    # -- the node senders' side (node_senders.LedgerTurns) ------------------------------

    def take_turn(self) -> None:
        """Hand everything queued since the last turn to the node senders."""
        self._scheduled = False
        if self._stopped:
            return
        batch, self.outbox = self.outbox, []
        size, self.outbox_bytes = self.outbox_bytes, 0
        resends, self._resends = self._resends, []
        self._end_turn()
        if not self._tracker.fenced:
            self._dispatch(batch, size, resends)

    def sends_to(self, member: EnsembleMember) -> bool:
        tracker = self._tracker
        return not (self._stopped or tracker.fenced or member not in tracker.ensemble.members)

    def issued_lac(self) -> int:
        return self._tracker.last_add_confirmed

    def answer(self, member: EnsembleMember, entries: Batch, lac: int, answer: AddAnswer) -> None:
        if self._stopped:
            return
        if isinstance(answer, BaseException):
            self._changer.member_failed(member, answer)  # R8
            return
        self.answered += 1
        self.lac_sent = max(self.lac_sent, lac)
        if answer is not None:  # an outcome per entry: some entry failed
            for outcome in answer:
                if outcome is not None:
                    self._refused(member, outcome)
                    return
        # every entry stored: a run of ids is acknowledged as a range
        first, last = entries[0][0], entries[-1][0]
        if last - first == len(entries) - 1:
            stored: Iterable[int] = range(first, last + 1)
        else:
            stored = [entry_id for entry_id, _ in entries]
        self._acknowledged(self._tracker.record_acks(member, stored))

    def call_finished(self) -> None:
        self._in_flight -= 1
        if not self._in_flight and self._calls_done is not None:
            self._calls_done.set()
            self._calls_done = None

    def _dispatch(
        self, batch: list[int], batch_bytes: int, resends: list[tuple[EnsembleMember, Batch]]
    ) -> None:
        tracker = self._tracker
        members = tracker.ensemble.members
        size, quorum = len(members), tracker.write_quorum
        failed = tracker.failed_members
        entries = self._entries
        everything = [(i, entries[i][0]) for i in batch]
        for member, resent in resends:
            if member in members and member not in failed:
                self._submit(member, resent, _payload_bytes(resent))
        if not everything:
            return
        for position, member in enumerate(members):
            if member in failed:
                continue  # its entries go to its replacement (R10)
            if quorum == size:
                self._submit(member, everything, batch_bytes)
                continue
            # R3: position p holds entry i when (p - i) mod E < Qw
            mine = [item for item in everything if (position - item[0]) % size < quorum]
            if mine:
                self._submit(member, mine, _payload_bytes(mine))

    def _submit(self, member: EnsembleMember, entries: Batch, size: int) -> None:
        """One batch of `size` payload bytes to `member`'s node queue, cut into pieces
        of at most `add_call_bytes_max` (a single larger entry alone) so that no call
        carries more."""
        limit = self._call_bytes_max
        if size > limit and len(entries) > 1:
            start, used = 0, 0
            for index, (_, entry) in enumerate(entries):
                cost = len(entry) - HEADER_BYTES
                if index > start and used + cost > limit:
                    self._submit_one(member, entries[start:index], used)
                    start, used = index, 0
                used += cost
            entries, size = entries[start:], used
        self._submit_one(member, entries, size)

    def _submit_one(self, member: EnsembleMember, entries: Batch, size: int) -> None:
        self._in_flight += 1
        self._senders.submit(self, member, entries, size)

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


def _payload_bytes(entries: Batch) -> int:
    """The payload bytes of encoded entries: what the client's pending bytes count, so
    that a node's backlog and the pending bytes compare (R8)."""
    return sum(len(entry) for _, entry in entries) - HEADER_BYTES * len(entries)
